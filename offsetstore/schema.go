package offsetstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/internal/deadletter"
)

// migrations are applied in order; each runs once, in its own transaction,
// and its index+1 is recorded as the schema version. Append, never edit.
var migrations = []string{
	// 1: offsets (and, before dedup could park records too, the
	// dead-letter table, which Migrate now creates with deadletter.Create
	// on every run, since dedup's Migrate may have created it first).
	`
CREATE TABLE eoskit_offsets (
	consumer_group text        NOT NULL,
	topic          text        NOT NULL,
	partition      integer     NOT NULL,
	next_offset    bigint      NOT NULL,
	owner          text        NOT NULL,
	updated_at     timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer_group, topic, partition)
);
`,
	// 2: the topic's ID with each offset, so that an offset stored for a
	// deleted topic is never applied to a new topic of the same name.
	// Rows from version 1 keep NULL (trusted) until their next commit.
	`ALTER TABLE eoskit_offsets ADD COLUMN topic_id uuid`,
}

// SchemaVersion is the schema version this package needs.
const SchemaVersion = 2

// Migrate creates or upgrades the tables offsetstore uses
// (eoskit_offsets, eoskit_dead_letters) to [SchemaVersion]. It is idempotent,
// and safe to run from several instances at once: a transaction-scoped
// advisory lock makes them take turns, and each sees what the one before it
// applied.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('eoskit.offsetstore.migrate'))`); err != nil {
			return fmt.Errorf("offsetstore: migrate: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS eoskit_offsetstore_schema (version integer NOT NULL)`); err != nil {
			return fmt.Errorf("offsetstore: migrate: %w", err)
		}
		var version int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM eoskit_offsetstore_schema`).Scan(&version); err != nil {
			return fmt.Errorf("offsetstore: migrate: %w", err)
		}
		if version > len(migrations) {
			return fmt.Errorf("offsetstore: the database schema is at version %d, newer than this code's %d: upgrade eoskit", version, len(migrations))
		}
		if err := deadletter.Create(ctx, tx); err != nil {
			return fmt.Errorf("offsetstore: migrate: %w", err)
		}
		for v := version; v < len(migrations); v++ {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return fmt.Errorf("offsetstore: migrate to version %d: %w", v+1, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO eoskit_offsetstore_schema (version) VALUES ($1)`, v+1); err != nil {
				return fmt.Errorf("offsetstore: migrate to version %d: %w", v+1, err)
			}
		}
		return nil
	})
}
