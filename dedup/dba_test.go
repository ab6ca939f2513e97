package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/integration"
)

// A DEFERRABLE INITIALLY DEFERRED constraint a record breaks is that
// record's fault: it fails the handler's statement, and DeadLetter parks
// the record while the others are applied once. Before, it failed at
// COMMIT, where no record can be blamed, and the batch was retried until
// Run ended (issue 43 item 12, failing on 3bfa998).
func TestADeferredConstraintIsTheRecordsFault(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE seen (v text, CONSTRAINT seen_once UNIQUE (v) DEFERRABLE INITIALLY DEFERRED);
		INSERT INTO seen VALUES ('taken')`); err != nil {
		t.Fatal(err)
	}
	b.produce(t, stamped(50)...)
	effect := b.handler("a")
	r := b.runConsumer(t, b.pool, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		v := string(rec.Value)
		if v == "m17" {
			v = "taken"
		}
		if _, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1)`, v); err != nil {
			return fmt.Errorf("%s: %w", rec.Value, err)
		}
		return effect(ctx, tx, rec)
	}, dedup.OnHandlerError(dedup.DeadLetter()))
	waitFor(t, "49 applied and m17 parked", func() bool {
		r.running(t)
		s := r.c.Stats()
		return s.Applied >= 49 && s.DeadLetters >= 1
	})
	r.stop(t)
	b.assertOnce(t, 49)
}

// A handler that commits (or rolls back) the consumer's transaction itself
// gets eoskit.ErrRunnerOwnsTx, and Run ends with it, whatever the handler
// returned, with nothing of the batch applied or claimed; a consumer with
// the handler mended then applies every message once. Before, its Commit
// ended the transaction with its claims, and Run stopped on a record
// ("tx is closed"; issue 43 item 13, failing on 3bfa998).
func TestAHandlerCannotEndTheRunnersTransaction(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"Commit", "Rollback"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			b := newBed(t, 1)
			b.produce(t, stamped(30)...)
			effect := b.handler("a")
			group := dedup.Group(integration.UniqueName(t, "g"))
			r := b.runConsumer(t, b.pool, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
				if err := effect(ctx, tx, rec); err != nil {
					return err
				}
				if end == "Commit" {
					_ = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
				return nil // the error ignored, as a careless handler does
			}, group)
			select {
			case err := <-r.done:
				if !errors.Is(err, eoskit.ErrRunnerOwnsTx) || !strings.Contains(err.Error(), "tx."+end) {
					t.Fatalf("Run = %v, want eoskit.ErrRunnerOwnsTx naming tx.%s", err, end)
				}
			case <-time.After(time.Minute):
				t.Fatal("Run did not end within a minute")
			}
			if n := b.effects(t); n != 0 {
				t.Fatalf("%d effects committed by the misused transaction, want 0", n)
			}
			mended := b.runConsumer(t, b.pool, effect, group)
			waitFor(t, "every message applied", func() bool { mended.running(t); return mended.c.Stats().Applied >= 30 })
			mended.stop(t)
			b.assertOnce(t, 30)
		})
	}
}

// A zombie's uncommitted claim of an id (a consumer frozen mid-batch, its
// transaction still open) holds the next owner's claim of the same id for
// at most the claim's lock timeout: the batch is then retried with a
// warning naming the lock wait, and applied once the zombie's transaction
// ends. Before, the claim waited without bound and without a word (issue
// 43 item 15, failing on 3bfa998).
func TestAZombiesClaimIsWaitedForWithABound(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	recs := stamped(10)
	b.produce(t, recs...)
	ctx := context.Background()
	zombie, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer zombie.Rollback(ctx)
	id, _ := dedup.HeaderID(dedup.IDHeader)(recs[3])
	if _, err := b.store.Claim(ctx, zombie, "effects", id); err != nil {
		t.Fatal(err)
	}
	logs := &logWatch{}
	r := b.runConsumer(t, b.pool, b.handler("a"), dedup.Scope("effects"), dedup.Logger(slog.New(slog.NewTextHandler(logs, nil))))
	deadline := time.Now().Add(30 * time.Second)
	for logs.count("55P03") == 0 {
		r.running(t)
		if time.Now().After(deadline) {
			t.Fatalf("30 s on, no warning of the claim's lock wait (applied %d)", r.c.Stats().Applied)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := zombie.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every message applied once the zombie's claim is gone", func() bool { r.running(t); return r.c.Stats().Applied >= 10 })
	r.stop(t)
	b.assertOnce(t, 10)
}
