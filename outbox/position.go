package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// position is the value of a relay's position record: the end of the last
// database transaction it published. The key is the server's system
// identifier and the slot's name, "system/slot".
type position struct {
	LSN   string `json:"lsn"`
	Key   string `json:"key"`
	Token string `json:"token"` // the slot's incarnation
}

// readTimeout bounds reading the position back: long enough for another
// relay's transaction open on the topic to end at its timeout.
const readTimeout = 2 * time.Minute

func positionRecord(topic, key, token string, end pglogrepl.LSN) *kgo.Record {
	v, _ := json.Marshal(position{LSN: end.String(), Key: key, Token: token})
	return &kgo.Record{Topic: topic, Partition: 0, Key: []byte(key), Value: v, Context: pinnedTo(0)}
}

// readPosition returns the last committed position under key in topic's
// partition 0, or 0 if it has none. It reads with read_committed up to the
// high watermark, keeping control records so that a partition ending in a
// transaction marker is still read to its end: a transaction open on the
// topic (another slot's relay, which shares it) is waited for, since its
// end decides whether records before ours count.
func readPosition(ctx context.Context, conn []kgo.Opt, topic, key string) (pglogrepl.LSN, string, error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	admCl, err := kgo.NewClient(conn...)
	if err != nil {
		return 0, "", fmt.Errorf("%w: %w", ErrPosition, err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, "", fmt.Errorf("%w: list the end of %s (it must exist): %w", ErrPosition, topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, "", fmt.Errorf("%w: list the start of %s: %w", ErrPosition, topic, err)
	}
	end, ok := ends.Lookup(topic, 0)
	start, _ := starts.Lookup(topic, 0)
	if !ok || end.Offset <= start.Offset {
		return 0, "", nil
	}

	cl, err := kgo.NewClient(append(slices.Clip(conn),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(start.Offset)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return 0, "", fmt.Errorf("%w: %w", ErrPosition, err)
	}
	defer cl.Close()
	var last pglogrepl.LSN
	var token string
	next := start.Offset
	for next < end.Offset {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, "", fmt.Errorf("%w: %s[0] read up to offset %d of %d within %s (a transaction open on it?): %w", ErrPosition, topic, next, end.Offset, readTimeout, err)
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return 0, "", fmt.Errorf("%w: read %s: %w", ErrPosition, topic, ferr)
		}
		var derr error
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end.Offset {
				return
			}
			next = r.Offset + 1
			if r.Attrs.IsControl() || string(r.Key) != key {
				return
			}
			var p position
			if err := json.Unmarshal(r.Value, &p); err != nil {
				derr = fmt.Errorf("%w: %s[0]@%d: %w", ErrPosition, topic, r.Offset, err)
				return
			}
			lsn, err := pglogrepl.ParseLSN(p.LSN)
			if err != nil {
				derr = fmt.Errorf("%w: %s[0]@%d: %w", ErrPosition, topic, r.Offset, err)
				return
			}
			last, token = lsn, p.Token
		})
		if derr != nil {
			return 0, "", finalError{derr}
		}
	}
	return last, token, nil
}
