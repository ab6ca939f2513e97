package outbox

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
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
	LSN   string `json:"lsn"`
	Key   string `json:"key"`
	Token string `json:"token"` // the slot's incarnation
	// Xid is the transaction id of the database transaction that ends at
	// LSN: a log that no longer holds it there was rewound (a restore).
	// 0 in positions written before it was kept.
	Xid uint32 `json:"xid,omitempty"`
	// Committed is that transaction's commit time (microseconds since
	// 1970): a restored server reuses transaction ids, and log positions
	// too under a regular workload, never commit times.
	Committed int64        `json:"committed,omitempty"`
	Undeleted []carriedTxn `json:"undeleted,omitempty"` // see undeleted
	lsn       pglogrepl.LSN
}

// readTimeout bounds reading the position topic to its high watermark.
// The read fetches what a read_committed read fetched before (a broker
// returns an aborted transaction's batches to both, and the markers
// too), so it takes the time that read took once no other slot's
// transaction holds it up: the whole log of one compacted partition.
const readTimeout = time.Minute

// defaultMarkerWait is the default bound of the wait, once the read
// reached the high watermark, for the markers of transactions still open
// there that hold records of this slot's key (written by a relay of this
// slot under another transactional id). A transaction its relay committed
// or aborted gets its markers within moments; one still running ends
// within its timeout (40 s by default, and the coordinator looks every
// 10 s), or a retry of the session (for RetryFor) waits again. One that
// never ends is a hanging transaction, which the read reports. (Tests
// shorten the wait.)
const defaultMarkerWait = time.Minute

func positionRecord(topic, key, token string, last *dbTxn, undeleted []carriedTxn) *kgo.Record {
	v, _ := json.Marshal(position{LSN: last.end.String(), Xid: last.xid, Committed: last.committed, Key: key, Token: token, Undeleted: undeleted})
	return &kgo.Record{Topic: topic, Partition: 0, Key: []byte(key), Value: v, Context: pinnedTo(0)}
}

// readPosition returns the last committed position under key in topic's
// partition 0, or one at 0 if it has none.
//
// It reads the partition's whole log up to its high watermark under
// read_uncommitted, transaction markers included, and decides itself
// which records count: a record of a transaction counts once its
// producer's commit marker follows it, one of an aborted transaction does
// not, and one written outside a transaction counts as it is. Of those,
// the one at the highest offset is the position, as a read_committed
// reader would find it. A read_committed read could not do: it stops at
// the last stable offset, short of our own committed records past another
// slot's transaction still open on the shared topic, and so would wait
// for that transaction to end (up to its timeout). Another slot's
// transaction still open at the high watermark is passed: it holds no
// record of key.
//
// A transaction still open there that holds records of key is waited for,
// past the high watermark, until its producer's marker decides it (for
// markerWait, a minute by default; then the read fails with ErrPosition
// naming the producer). Registering our transactional id first decided
// every transaction of our own, but not one of a relay of this slot that
// ran under another transactional id (the id, or what it is derived from,
// changed across a deploy): its EndTxn may have returned, the commit
// decided, and the relay died before the markers were written. Passing
// such a transaction would take the position before it and publish its
// records again; and a transaction whose marker never comes (a hanging
// one: Kafka 4.1 to 4.4 drop markers for a leaderless partition,
// KAFKA-20734) would be decided, unseen, by the next marker of its
// producer id.
func readPosition(ctx context.Context, conn []kgo.Opt, topic, key string, markerWait time.Duration) (position, error) {
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	admCl, err := kgo.NewClient(conn...)
	if err != nil {
		return position{}, fmt.Errorf("%w: %w", ErrPosition, err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	ends, err := adm.ListEndOffsets(rctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return position{}, fmt.Errorf("%w: list the end of %s (it must exist): %w", ErrPosition, topic, err)
	}
	starts, err := adm.ListStartOffsets(rctx, topic)
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
	next := start.Offset // the offset after the last record read
	// poll reads until done: below end, every record; past it, only the
	// records and markers of the producers still in open (the
	// transactions open at end), so that the read still finds the
	// position as of end, with those transactions decided.
	poll := func(ctx context.Context, done func() bool) error {
		for !done() {
			fetches := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				return err
			}
			var ferr error
			fetches.EachError(func(_ string, _ int32, err error) { ferr = err })
			if ferr != nil {
				return fmt.Errorf("read %s: %w", topic, ferr)
			}
			fetches.EachRecord(func(r *kgo.Record) {
				next = r.Offset + 1
				if _, waited := open[r.ProducerID]; r.Offset >= end.Offset && !waited {
					return
				}
				switch {
				case r.Attrs.IsControl():
					// The key of a marker: int16 version, int16 type
					// (0 abort, 1 commit).
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
		return nil
	}
	if err := poll(rctx, func() bool { return next >= end.Offset }); err != nil {
		if rctx.Err() != nil {
			return position{}, fmt.Errorf("%w: %s[0] read up to offset %d of %d within %s: %w", ErrPosition, topic, next, end.Offset, readTimeout, err)
		}
		return position{}, fmt.Errorf("%w: %w", ErrPosition, err)
	}
	if len(open) > 0 {
		wctx, cancel := context.WithTimeout(ctx, markerWait)
		defer cancel()
		if err := poll(wctx, func() bool { return len(open) == 0 }); err != nil {
			if wctx.Err() == nil {
				return position{}, fmt.Errorf("%w: %w", ErrPosition, err)
			}
			var undecided []string
			for _, id := range slices.Sorted(maps.Keys(open)) {
				rs := open[id]
				undecided = append(undecided, fmt.Sprintf("producer id %d (epoch %d) from offset %d", id, rs[0].ProducerEpoch, rs[0].Offset))
			}
			return position{}, fmt.Errorf("%w: %s[0]: this slot's position (key %s) is in a transaction still undecided %s after the read reached offset %d, the end (read to %d): %s (a relay of this slot under another transactional id, or a hanging transaction): %w",
				ErrPosition, topic, key, markerWait, end.Offset, next, strings.Join(undecided, ", "), err)
		}
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
