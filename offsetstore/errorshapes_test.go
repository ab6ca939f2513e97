package offsetstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/offsetstore"
)

// A statement the database cancelled (SQLSTATE 57014: statement_timeout,
// pg_cancel_backend) is a wait, not the record's fault: the batch is
// retried without blame, even under Stop and named with Reject, and every
// record applied once; before, the record was stopped on (issue 43 item
// 11, failing on 3bfa998).
func TestACancelledStatementIsNoRecordsFault(t *testing.T) {
	t.Parallel()
	const n = 200
	b := newBed(t, 2, n)
	var mu sync.Mutex
	cancelled := map[string]bool{}
	h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		for _, r := range recs {
			if r.Offset%37 != 5 {
				continue
			}
			mu.Lock()
			first := !cancelled[string(r.Key)]
			cancelled[string(r.Key)] = true
			mu.Unlock()
			if first {
				// What a DBA's statement_timeout does to a slow statement.
				if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = 50`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `SELECT pg_sleep(2)`)
				// Named, as a handler that knows its record does:
				// still not the record's fault.
				return offsetstore.Reject(r, fmt.Errorf("slow report: %w", err))
			}
		}
		return load(nil)(ctx, tx, recs)
	}
	run := b.start(t, h)
	waitFor(t, time.Minute, "every record applied", func() bool {
		select {
		case <-run.finished:
			t.Fatalf("Run returned %v: a cancelled statement was blamed on its record", run.err)
		default:
		}
		return run.r.Stats().Records >= n
	})
	run.stop(t)
	b.verify(t)
	if s := run.r.Stats(); s.DeadLetters != 0 {
		t.Fatalf("Stats %+v: a record was parked", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(cancelled) == 0 {
		t.Fatal("no statement was cancelled: the test proves nothing")
	}
}

// A CopyFrom a row of which cannot be written (its source fails at that
// row) is cancelled by pgx, and PostgreSQL reports 57014 "COPY from stdin
// failed": the row's fault, not a wait. DeadLetter parks exactly the bad
// records, the others applied once.
func TestACopyARowFailsIsThatRecordsFault(t *testing.T) {
	t.Parallel()
	const n = 400
	b := newBed(t, 1, n)
	h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		i := -1
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"results"}, []string{"id", "part", "off"}, pgx.CopyFromFunc(func() ([]any, error) {
			if i++; i == len(recs) {
				return nil, nil
			}
			r := recs[i]
			if isBad(r) {
				return nil, fmt.Errorf("cannot encode %d", r.Offset)
			}
			return []any{string(r.Key), r.Partition, r.Offset}, nil
		}))
		return err
	}
	run := b.start(t, h, offsetstore.OnHandlerError(offsetstore.DeadLetter()))
	waitFor(t, time.Minute, "every record applied or parked", func() bool {
		select {
		case <-run.finished:
			t.Fatalf("Run returned %v: a failed COPY row was taken for a wait", run.err)
		default:
		}
		return run.r.Stats().Records >= n
	})
	run.stop(t)
	var good []string
	for i, id := range b.inputs {
		if !slices.Contains(badOffsets, int64(i)) {
			good = append(good, id)
		}
	}
	b.inputs = good
	b.verify(t)
	rows, err := b.pool.Query(context.Background(), `SELECT "offset" FROM eoskit_dead_letters WHERE consumer_group = $1 ORDER BY "offset"`, b.group)
	if err != nil {
		t.Fatal(err)
	}
	parked, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(parked, badOffsets) {
		t.Fatalf("parked %v, want exactly the bad records %v", parked, badOffsets)
	}
}
