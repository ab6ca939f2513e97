package offsetstore_test

import (
	"context"
	"errors"
	"fmt"
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
// is refused with eoskit.ErrRunnerOwnsTx, and the batch commits once with
// its offsets. Before, its Commit ended the transaction early: the offsets
// row never moved and the batch's effects were applied again at every
// retry (issue 43 item 13, failing on 3bfa998).
func TestAHandlerCannotEndTheRunnersTransaction(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"Commit", "Rollback"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			const n = 200
			b := newBed(t, 2, n)
			refused := make(chan error, 1)
			h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
				if err := load(nil)(ctx, tx, recs); err != nil {
					return err
				}
				var err error
				if end == "Commit" {
					err = tx.Commit(ctx)
				} else {
					err = tx.Rollback(ctx)
				}
				select {
				case refused <- err:
				default:
				}
				return nil // the error ignored, as a careless handler does
			}
			run := b.start(t, h)
			waitFor(t, time.Minute, "every record applied", func() bool {
				select {
				case <-run.finished:
					t.Fatalf("Run returned %v", run.err)
				default:
				}
				return run.r.Stats().Records >= n
			})
			run.stop(t)
			b.verify(t)
			if err := <-refused; !errors.Is(err, eoskit.ErrRunnerOwnsTx) {
				t.Fatalf("the handler's %s returned %v, want eoskit.ErrRunnerOwnsTx", end, err)
			}
		})
	}
}
