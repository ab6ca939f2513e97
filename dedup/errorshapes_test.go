package dedup_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/testsupport/contract"
)

// The error shapes a handler meets that are not the database's (an
// enrichment call that cannot connect, a decoder on an empty value, a
// deadline of its own) are the record's: parked under the policy's rule,
// the other 99 records applied once, Run going on. Before, the consumer
// took them for the database's, retried the batch 10 times and ended Run
// (issue 43 item 10, failing on 3bfa998: a wrapped io.EOF under
// DeadLetter ended Run with 38 of 99 applied).
func TestHandlerErrorShapesGoToThePolicy(t *testing.T) {
	t.Parallel()
	for _, shape := range contract.Shapes() {
		t.Run(shape.Name, func(t *testing.T) {
			t.Parallel()
			b := newBed(t, 2)
			b.produce(t, stamped(100)...)
			effect := b.handler("a")
			r := b.runConsumer(t, b.pool, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
				if string(rec.Value) == "m42" {
					return shape.Err(rec.Offset)
				}
				return effect(ctx, tx, rec)
			}, dedup.OnHandlerError(contract.Policy(dedup.DeadLetter())))
			waitFor(t, "99 applied and m42 parked", func() bool {
				r.running(t)
				s := r.c.Stats()
				return s.Applied >= 99 && s.DeadLetters >= 1
			})
			r.stop(t)
			b.assertOnce(t, 99)
			var parked int
			if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM eoskit_dead_letters WHERE value = 'm42'`).Scan(&parked); err != nil {
				t.Fatal(err)
			}
			if parked != 1 {
				t.Fatalf("%d dead letters for m42, want 1", parked)
			}
		})
	}
}

// A statement the database cancelled (57014: statement_timeout) is a wait,
// not the record's fault: retried without blame under Stop, every record
// applied once (issue 43 item 11).
func TestACancelledStatementIsNoRecordsFault(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	b.produce(t, stamped(20)...)
	effect := b.handler("a")
	var mu sync.Mutex
	var cancels int
	r := b.runConsumer(t, b.pool, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		mu.Lock()
		first := string(rec.Value) == "m7" && cancels < 2
		if first {
			cancels++
		}
		mu.Unlock()
		if first {
			if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = 50`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT pg_sleep(2)`)
			return fmt.Errorf("slow report: %w", err)
		}
		return effect(ctx, tx, rec)
	})
	waitFor(t, "every record applied", func() bool { r.running(t); return r.c.Stats().Applied >= 20 })
	r.stop(t)
	b.assertOnce(t, 20)
	mu.Lock()
	defer mu.Unlock()
	if cancels == 0 {
		t.Fatal("no statement was cancelled: the test proves nothing")
	}
}
