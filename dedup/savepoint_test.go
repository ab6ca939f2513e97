package dedup_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eoskit/eoskit"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
)

// badValues are the malformed messages of the savepoint tests: the first,
// two side by side, one near the end (m120 panics).
var badValues = []string{"m0", "m17", "m120", "m121", "m250"}

// handlerRuns counts the handler's runs per message.
type handlerRuns struct {
	mu   sync.Mutex
	runs map[string]int
}

func (h *handlerRuns) note(r *kgo.Record) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.runs == nil {
		h.runs = map[string]int{}
	}
	h.runs[string(r.Value)]++
}

func (h *handlerRuns) of(v string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.runs[v]
}

// badHandler fails (or panics) on the bad messages and applies the others
// with the bed's handler; before is called first with every record.
func (b *bed) badHandler(runs *handlerRuns, before func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error) dedup.Handler {
	apply := b.handler("a")
	return func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		runs.note(r)
		if before != nil {
			if err := before(ctx, tx, r); err != nil {
				return err
			}
		}
		switch v := string(r.Value); {
		case v == "m120":
			panic("cannot parse " + v)
		case slices.Contains(badValues, v):
			return fmt.Errorf("malformed %s", v)
		}
		return apply(ctx, tx, r)
	}
}

// checkSettled waits until every message was applied or parked, then
// checks that each good message took effect once and exactly the bad ones
// were parked, once each.
func (b *bed) checkSettled(t *testing.T, r *run, n int) {
	t.Helper()
	waitFor(t, "every message applied or parked", func() bool {
		r.running(t)
		s := r.c.Stats()
		return s.Applied+s.DeadLetters >= int64(n)
	})
	r.stop(t)
	b.assertOnce(t, n-len(badValues))
	rows, err := b.pool.Query(context.Background(), `SELECT convert_from(value, 'UTF8') FROM eoskit_dead_letters ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	parked, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(parked, badValues) {
		t.Fatalf("parked %v, want exactly the bad messages %v", parked, badValues)
	}
	if s := r.c.Stats(); s.Applied != int64(n-len(badValues)) || s.DeadLetters != int64(len(badValues)) {
		t.Fatalf("Stats %+v, want %d applied and %d parked", s, n-len(badValues), len(badValues))
	}
}

// Bad messages spread through a batch, under DeadLetter: the batch runs at
// most twice (a clean run that meets the first failure, then one run in
// which each failure rolls back to a savepoint and is parked), not once
// more per bad message; each good message takes effect once and exactly
// the bad ones are parked. The first message is counted: it is in the
// batch whatever the poll's size. Before, it ran once per bad message and
// once more (six runs).
func TestBadMessagesDoNotRerunTheBatchEach(t *testing.T) {
	t.Parallel()
	const n = 300
	b := newBed(t, 1)
	b.produce(t, stamped(n)...)
	var runs handlerRuns
	r := b.runConsumer(t, b.pool, b.badHandler(&runs, nil), dedup.Scope("effects"), dedup.OnHandlerError(dedup.DeadLetter()))
	b.checkSettled(t, r, n)
	if got := runs.of("m1"); got > 2 {
		t.Fatalf("the batch's second message ran %d times, want at most 2 (one clean run, one run with savepoints)", got)
	}
}

// The database connection is terminated (pg_terminate_backend) in the
// savepoint phase, at a good message after the first failure: that is the
// database's doing, not the message's. The batch is retried whole, the
// good message is applied (never parked), and every message ends applied
// once or parked once.
func TestConnectionLostInTheSavepointPhaseIsNotBlamedOnAMessage(t *testing.T) {
	t.Parallel()
	const n = 300
	b := newBed(t, 1)
	b.produce(t, stamped(n)...)
	var runs handlerRuns
	var killed atomic.Bool
	r := b.runConsumer(t, b.pool, b.badHandler(&runs, func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		// m60 in the savepoint phase: m0 failed first, and m17 was
		// parked in the run since.
		if string(r.Value) == "m60" && runs.of("m17") > 0 && killed.CompareAndSwap(false, true) {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return fmt.Errorf("write: %w", err)
		}
		return nil
	}), dedup.Scope("effects"), dedup.OnHandlerError(dedup.DeadLetter()))
	b.checkSettled(t, r, n)
	if !killed.Load() {
		t.Fatal("the connection was never terminated in the savepoint phase")
	}
}

// Under Retry(3) then DeadLetter, bad messages spread through a batch are
// each run three times (its attempts), then parked in the batch's
// transaction; good messages take effect once.
func TestRetryThenDeadLetterWithSavepoints(t *testing.T) {
	t.Parallel()
	const n = 300
	b := newBed(t, 1)
	b.produce(t, stamped(n)...)
	var runs handlerRuns
	r := b.runConsumer(t, b.pool, b.badHandler(&runs, nil), dedup.Scope("effects"),
		dedup.OnHandlerError(eoskit.Retry(time.Millisecond, 3).Then(dedup.DeadLetter())))
	b.checkSettled(t, r, n)
	for _, v := range badValues {
		if got := runs.of(v); got != 3 {
			t.Errorf("%s ran %d times, want 3 (the Retry's attempts)", v, got)
		}
	}
}

// A handler that fails on a bad message leaving rows open on the
// transaction's connection ("conn busy" for every statement after, the
// rollback to a savepoint included) fails for the message's fault, not
// the database's, in the savepoint phase too: the bad messages are parked
// and Run goes on. Before, the failed rollback of the second bad message
// was read as the database's doing and the batch retried until Run gave
// up.
func TestAFailureLeavingRowsOpenIsTheMessages(t *testing.T) {
	t.Parallel()
	const n = 300
	b := newBed(t, 1)
	b.produce(t, stamped(n)...)
	var runs handlerRuns
	r := b.runConsumer(t, b.pool, b.badHandler(&runs, func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if v := string(r.Value); slices.Contains(badValues, v) && v != "m120" {
			rows, err := tx.Query(ctx, `SELECT generate_series(1, 1000)`)
			if err != nil {
				return err
			}
			rows.Next() // and left open
			return fmt.Errorf("malformed %s", v)
		}
		return nil
	}), dedup.Scope("effects"), dedup.OnHandlerError(dedup.DeadLetter()))
	b.checkSettled(t, r, n)
}
