package eoslab

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/outbox"
)

// dropSlot drops a run's replication slot once no relay reads it, waiting
// up to timeout: a relay that has just stopped closed its replication
// connection, but its WAL sender may take a moment to exit, and until then
// PostgreSQL refuses to drop the slot (55006, "is active"). Without the
// wait the second outbox row failed on a fast server (eoslab's embedded
// one): the first row's slot was still active when the second dropped it.
func dropSlot(ctx context.Context, pool *pgxpool.Pool, slot string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := outbox.DropSlot(ctx, pool, slot)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "55006" || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
