package dedup

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/deadletter"
)

// PostgresStore records processed message ids in a PostgreSQL table with a
// primary key on (scope, id). Ids are stored as bytes (bytea): binary keys
// (a schema-registry key starts with 0x00) and headers that are not UTF-8
// are ids like any other. A claim is an INSERT ... ON CONFLICT DO
// NOTHING inside the caller's transaction, so the claim commits or rolls
// back with the side effect made in the same transaction. Two transactions
// claiming one id at once serialise on the key: the second waits for the
// first, and claims only if the first rolled back. There is no
// check-then-insert window.
type PostgresStore struct {
	name  string // the table's name
	table string // quoted identifier
}

var identifier = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]{0,62}$`)

// NewPostgresStore returns a store on the table with the given name
// (default "eoskit_processed_ids" when empty). Create it with
// [PostgresStore.Migrate].
func NewPostgresStore(table string) (*PostgresStore, error) {
	if table == "" {
		table = "eoskit_processed_ids"
	}
	if !identifier.MatchString(table) {
		return nil, &eoskit.ConfigError{Package: "dedup", Setting: "table", Reason: fmt.Sprintf("%q must be a plain identifier", table)}
	}
	return &PostgresStore{name: table, table: pgx.Identifier{table}.Sanitize()}, nil
}

// Migrate creates the table and its index if they do not exist, and the
// eoskit_dead_letters table that the [DeadLetter] policy parks records in
// (the one offsetstore uses, if it is not there yet), and turns
// the id column of a table made by an earlier eoskit (text) into bytea, each
// id its UTF-8 bytes, so that claims keep matching. It is idempotent and
// safe to run from several instances at once (an advisory lock serialises
// them). That conversion rewrites the table and its key under an exclusive
// lock, which blocks claims while it runs; consumers of the earlier version
// cannot claim in the converted table, so stop them first. A [Consumer]
// refuses, at Run, a table not yet converted.
func (s *PostgresStore) Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('eoskit.dedup.migrate'))`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
CREATE TABLE IF NOT EXISTS `+s.table+` (
	scope        text        NOT NULL,
	id           bytea       NOT NULL,
	processed_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (scope, id)
);
CREATE INDEX IF NOT EXISTS `+pgx.Identifier{indexName(s.table)}.Sanitize()+` ON `+s.table+` (processed_at);`); err != nil {
			return err
		}
		if err := deadletter.Create(ctx, tx); err != nil {
			return err
		}
		// A dead-letter replay releases claims only in a table so marked.
		if err := deadletter.MarkClaimTable(ctx, tx, s.table); err != nil {
			return err
		}
		idType, err := s.idType(ctx, tx)
		if err != nil || idType == "bytea" {
			return err
		}
		_, err = tx.Exec(ctx, `ALTER TABLE `+s.table+` ALTER COLUMN id TYPE bytea USING convert_to(id, 'UTF8')`)
		return err
	})
}

func indexName(quoted string) string {
	return quoted[1:len(quoted)-1] + "_processed_at_idx"
}

// check refuses a table that Migrate has not brought up to date (ids still
// text, from an earlier eoskit): every claim would fail on it. A table that
// does not exist yet is left for the first claim to report.
func (s *PostgresStore) check(ctx context.Context, pool *pgxpool.Pool) error {
	idType, err := s.idType(ctx, pool)
	switch {
	case err != nil:
		return fmt.Errorf("dedup: check the ids table %s: %w", s.table, err)
	case idType != "" && idType != "bytea":
		return &eoskit.ConfigError{Package: "dedup", Setting: "database schema", Reason: fmt.Sprintf("the ids table %s holds ids as %s, not bytea: run PostgresStore.Migrate (stop consumers of an earlier eoskit first: they cannot claim in the migrated table)", s.table, idType)}
	}
	return nil
}

// idType returns the type of the table's id column, "" if there is no such
// table.
func (s *PostgresStore) idType(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (string, error) {
	var idType string
	err := q.QueryRow(ctx, `SELECT format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname = 'id'`, s.table).Scan(&idType)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return idType, err
}

// checkID refuses an id the table's key cannot hold, before the database
// sees it.
func checkID(scope, id string) error {
	if len(id) > MaxIDLength {
		return fmt.Errorf("dedup: claim in %s: %w (%d bytes)", scope, ErrIDTooLong, len(id))
	}
	return nil
}

// Claim records id as processed in scope, within tx, and reports whether
// this call claimed it (false: already processed, or claimed by a
// transaction that committed first). Apply the side effect in the same tx
// only when it returns true.
// An id longer than [MaxIDLength] is refused with an error wrapping
// [ErrIDTooLong] before the database sees it.
func (s *PostgresStore) Claim(ctx context.Context, tx pgx.Tx, scope, id string) (bool, error) {
	if err := checkID(scope, id); err != nil {
		return false, err
	}
	tag, err := tx.Exec(ctx, `INSERT INTO `+s.table+` (scope, id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, scope, []byte(id))
	if err != nil {
		return false, fmt.Errorf("dedup: claim %s/%q: %w", scope, id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ClaimBatch is [PostgresStore.Claim] for many ids in one statement. It
// returns the set of ids this call claimed. Ids are claimed in sorted order,
// so two batches with overlapping ids lock them in the same order and do not
// deadlock.
func (s *PostgresStore) ClaimBatch(ctx context.Context, tx pgx.Tx, scope string, ids []string) (map[string]bool, error) {
	b := &pgx.Batch{}
	set, err := s.queueClaimBatch(b, scope, ids)
	if err != nil {
		return nil, err
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("dedup: claim %d ids in %s: %w", len(ids), scope, err)
	}
	return set, nil
}

// queueClaimBatch queues ClaimBatch's statement on b, for a consumer to
// send in one round trip with what opens its transaction; the set it
// returns holds the ids claimed once b was sent without error.
func (s *PostgresStore) queueClaimBatch(b *pgx.Batch, scope string, ids []string) (map[string]bool, error) {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	raw := make([][]byte, len(sorted))
	for i, id := range sorted {
		if err := checkID(scope, id); err != nil {
			return nil, err
		}
		raw[i] = []byte(id)
	}
	set := make(map[string]bool, len(sorted))
	// Sorted as bytes, as Go sorts strings: the order the rows are
	// locked in is the same for every batch.
	b.Queue(`
INSERT INTO `+s.table+` (scope, id)
SELECT $1, x FROM unnest($2::bytea[]) AS x ORDER BY x
ON CONFLICT DO NOTHING
RETURNING id`, scope, raw).Query(func(rows pgx.Rows) error {
		claimed, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil {
			return fmt.Errorf("dedup: claim %d ids in %s: %w", len(sorted), scope, err)
		}
		for _, id := range claimed {
			set[string(id)] = true
		}
		return nil
	})
	return set, nil
}

// Purge deletes the ids processed before olderThan, in transactions of at
// most batch rows each, and returns how many it deleted. Rows a running
// claim holds are skipped (SKIP LOCKED), so purging never waits for, nor
// blocks, the consumers; each short transaction holds its row locks only
// for its own batch.
//
// olderThan must lie further back than the longest possible redelivery
// delay (consumer lag, an offset reset, a replay from backup): a copy of a
// message that arrives after its id was purged is applied again.
func (s *PostgresStore) Purge(ctx context.Context, pool *pgxpool.Pool, olderThan time.Time, batch int) (int64, error) {
	if batch <= 0 {
		return 0, &eoskit.ConfigError{Package: "dedup", Setting: "batch", Reason: "Purge's batch must be positive"}
	}
	var total int64
	for {
		tag, err := pool.Exec(ctx, `
DELETE FROM `+s.table+` WHERE ctid IN (
	SELECT ctid FROM `+s.table+` WHERE processed_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED
)`, olderThan, batch)
		if err != nil {
			return total, fmt.Errorf("dedup: purge: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, errors.Join(fmt.Errorf("dedup: purge interrupted after %d rows", total), err)
		}
	}
}
