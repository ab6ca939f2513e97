package dedup_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

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
