package offsetstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/offsetstore"
)

// The error shapes a handler meets that are not the database's: an
// enrichment call that cannot connect (*net.OpError), a decoder on an
// empty value (io.EOF), a deadline of the handler's own
// (context.DeadlineExceeded). Each is the record's, and goes to the rule
// the policy gives it; before, the runner took each for the database's,
// retried the batch 10 times and ended Run ("batch failed 10 times", 0 of
// the other records applied; issue 43 item 10, failing on 3bfa998).
func TestHandlerErrorShapesGoToThePolicy(t *testing.T) {
	t.Parallel()
	shapes := map[string]func(off int64) error{
		"net.OpError": func(off int64) error {
			return fmt.Errorf("enrich %d: %w", off, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")})
		},
		"io.EOF":                   func(off int64) error { return fmt.Errorf("decode %d: %w", off, io.EOF) },
		"context.DeadlineExceeded": func(off int64) error { return fmt.Errorf("pricing %d: %w", off, context.DeadlineExceeded) },
	}
	policy := eoskit.Classify(eoskit.Stop(),
		eoskit.WhenAs[*net.OpError](eoskit.Retry(time.Millisecond, 3).Then(offsetstore.DeadLetter())),
		eoskit.When(io.EOF, offsetstore.DeadLetter()),
		eoskit.When(context.DeadlineExceeded, offsetstore.DeadLetter()),
	)
	for name, shape := range shapes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const n = 400
			b := newBed(t, 1, n)
			h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
				for _, r := range recs {
					if isBad(r) {
						return shape(r.Offset)
					}
				}
				return load(nil)(ctx, tx, recs)
			}
			run := b.start(t, h, offsetstore.OnHandlerError(policy))
			b.checkSettled(t, run, n, func(off int64) string { return shape(off).Error() })
		})
	}
}

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
