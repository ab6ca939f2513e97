package outbox

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// position is the value of a relay's position record: the end of the last
// database transaction it published, and the published rows not deleted
// yet. The key is the server's system identifier and the slot's name,
// "system/slot".
type position struct {
	LSN       string       `json:"lsn"`
	Key       string       `json:"key"`
	Token     string       `json:"token"`               // the slot's incarnation
	Undeleted []carriedTxn `json:"undeleted,omitempty"` // see undeleted
	lsn       pglogrepl.LSN
}

// readTimeout bounds reading the position back. The read waits for no
// other relay's transaction, so it is only the time a read of the topic
// takes.
const readTimeout = time.Minute

func positionRecord(topic, key, token string, end pglogrepl.LSN, undeleted []carriedTxn) *kgo.Record {
	v, _ := json.Marshal(position{LSN: end.String(), Key: key, Token: token, Undeleted: undeleted})
	return &kgo.Record{Topic: topic, Partition: 0, Key: []byte(key), Value: v, Context: pinnedTo(0)}
}

// readPosition returns the last committed position under key in topic's
// partition 0, or one at 0 if it has none.
//
// It reads the partition's whole log up to its high watermark under
// read_uncommitted, transaction markers included, and decides itself
// which records count: a record of a transaction counts once its
// producer's commit marker follows it, one of an aborted or still open
// transaction does not, and one written outside a transaction counts as
// it is. Of those, the one at the highest offset is the position, as a
// read_committed reader would find it. A read_committed read could not
// do: it stops at the last stable offset, short of our own committed
// records past another slot's transaction still open on the shared topic,
// and so would wait for that transaction to end (up to its timeout).
// Every transaction of our own is decided by the time this runs: the
// caller registered the transactional id first, which completes (markers
// written) or aborts whatever an earlier relay with it left.
func readPosition(ctx context.Context, conn []kgo.Opt, topic, key string) (position, error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	admCl, err := kgo.NewClient(conn...)
	if err != nil {
		return position{}, fmt.Errorf("%w: %w", ErrPosition, err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return position{}, fmt.Errorf("%w: list the end of %s (it must exist): %w", ErrPosition, topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return position{}, fmt.Errorf("%w: list the start of %s: %w", ErrPosition, topic, err)
	}
	end, ok := ends.Lookup(topic, 0)
	start, _ := starts.Lookup(topic, 0)
	if !ok || end.Offset <= start.Offset {
		return position{}, nil
	}

	cl, err := kgo.NewClient(append(slices.Clip(conn),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(start.Offset)}}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return position{}, fmt.Errorf("%w: %w", ErrPosition, err)
	}
	defer cl.Close()
	var last *kgo.Record              // the committed record of key at the highest offset
	open := map[int64][]*kgo.Record{} // key's records of each producer's undecided transaction
	count := func(r *kgo.Record) {
		if last == nil || r.Offset > last.Offset {
			last = r
		}
	}
	next := start.Offset
	for next < end.Offset {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return position{}, fmt.Errorf("%w: %s[0] read up to offset %d of %d within %s: %w", ErrPosition, topic, next, end.Offset, readTimeout, err)
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return position{}, fmt.Errorf("%w: read %s: %w", ErrPosition, topic, ferr)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end.Offset {
				return
			}
			next = r.Offset + 1
			switch {
			case r.Attrs.IsControl():
				// The key of a marker: int16 version, int16 type (0
				// abort, 1 commit).
				if len(r.Key) >= 4 && binary.BigEndian.Uint16(r.Key[2:4]) == 1 {
					for _, c := range open[r.ProducerID] {
						count(c)
					}
				}
				delete(open, r.ProducerID)
			case string(r.Key) != key:
			case r.Attrs.IsTransactional():
				open[r.ProducerID] = append(open[r.ProducerID], r)
			default:
				count(r)
			}
		})
	}
	if last == nil {
		return position{}, nil
	}
	var p position
	if err := json.Unmarshal(last.Value, &p); err != nil {
		return position{}, finalError{fmt.Errorf("%w: %s[0]@%d: %w", ErrPosition, topic, last.Offset, err)}
	}
	if p.lsn, err = pglogrepl.ParseLSN(p.LSN); err != nil {
		return position{}, finalError{fmt.Errorf("%w: %s[0]@%d: %w", ErrPosition, topic, last.Offset, err)}
	}
	return p, nil
}
