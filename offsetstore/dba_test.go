package offsetstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/offsetstore"
)

// A DEFERRABLE INITIALLY DEFERRED constraint a record breaks is that
// record's fault: it fails the handler's statement, inside the record's
// savepoint, and DeadLetter parks the record while the others are applied
// once. Before, it failed at COMMIT, where no record can be blamed: the
// batch was retried as the database's failure and Run ended ("batch failed
// 10 times"; issue 43 item 12, failing on 3bfa998).
func TestADeferredConstraintIsTheRecordsFault(t *testing.T) {
	t.Parallel()
	const n = 400
	b := newBed(t, 1, n)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE seen (v bigint, CONSTRAINT seen_once UNIQUE (v) DEFERRABLE INITIALLY DEFERRED);
		INSERT INTO seen VALUES (-1)`); err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		for _, r := range recs {
			v := r.Offset
			if isBad(r) {
				v = -1 // taken: the deferred constraint refuses it
			}
			if _, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1)`, v); err != nil {
				return fmt.Errorf("record %d: %w", r.Offset, err)
			}
		}
		return load(nil)(ctx, tx, recs)
	}
	run := b.start(t, h, offsetstore.OnHandlerError(offsetstore.DeadLetter()))
	b.checkSettled(t, run, n, func(off int64) string {
		return fmt.Sprintf(`record %d: ERROR: duplicate key value violates unique constraint "seen_once" (SQLSTATE 23505)`, off)
	})
}

// A handler that commits (or rolls back) the runner's transaction itself
// gets eoskit.ErrRunnerOwnsTx, and Run ends with it, whatever the handler
// returned, with nothing of the batch committed: its writes cannot be
// what it meant (a Rollback "to skip" would commit its partial writes). A
// runner with the handler mended then applies everything once. Before,
// its Commit ended the transaction early: the offsets row never moved and
// Run ended after 10 attempts with "tx is closed" (issue 43 item 13,
// failing on 3bfa998).
func TestAHandlerCannotEndTheRunnersTransaction(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"Commit", "Rollback"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			const n = 200
			b := newBed(t, 2, n)
			h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
				if err := load(nil)(ctx, tx, recs); err != nil {
					return err
				}
				if end == "Commit" {
					_ = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
				return nil // the error ignored, as a careless handler does
			}
			err := b.start(t, h).wait(t, time.Minute)
			if !errors.Is(err, eoskit.ErrRunnerOwnsTx) || !strings.Contains(err.Error(), "tx."+end) {
				t.Fatalf("Run = %v, want eoskit.ErrRunnerOwnsTx naming tx.%s", err, end)
			}
			if rows := b.rows(t); rows != 0 {
				t.Fatalf("%d rows committed by the misused transaction, want 0", rows)
			}
			run := b.start(t, load(nil))
			waitFor(t, time.Minute, "every record applied", func() bool { return run.r.Stats().Records >= n })
			run.stop(t)
			b.verify(t)
		})
	}
}
