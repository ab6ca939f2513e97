package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Table is the default outbox's table, which [Write] inserts into; an
// outbox with a [Name] has its own, eoskit_outbox_<name>.
const Table = "eoskit_outbox"

// DeadLetterTable keeps, whole, the records a relay of the default outbox
// sent to its [DeadLetter] topic (the dead letter itself omits a value
// Kafka refused as too large); an outbox with a [Name] keeps them in
// eoskit_outbox_<name>_dead_letters.
const DeadLetterTable = "eoskit_outbox_dead_letters"

// Publication is the publication [Migrate] creates over [Table] (inserts
// only), which the relay's pgoutput stream reads; an outbox with a [Name]
// has its own, named like its table.
const Publication = "eoskit_outbox"

// migrations are applied in order, to one outbox's tables (their names
// from n); each runs once, in its own transaction, and its index+1 is
// recorded as the outbox's schema version. Append, never edit, save
// that a statement of the tables every outbox of a database shares may
// become one that tolerates another outbox having created them.
var migrations = []func(n names) string{
	// 1: the outbox and its publication. Rows are a vehicle: the relay
	// reads them from the write-ahead log, in commit order, and deletes
	// them once read. Dead-lettered records are kept whole beside it.
	// The relay holding a slot beats in eoskit_outbox_relays, which
	// standbys watch (pg_stat_replication hides reply times from roles
	// without pg_read_all_stats). eoskit_outbox_slots holds each slot's
	// incarnation token, which its positions in Kafka carry. Those two
	// are by slot, and were shared by the database's outboxes (IF NOT
	// EXISTS since outboxes have names); since version 2 they are the
	// default outbox's, and a named outbox creates them no more.
	func(n names) string {
		shared := `
CREATE TABLE IF NOT EXISTS eoskit_outbox_relays (
	slot    text        PRIMARY KEY,
	pid     integer     NOT NULL,
	beat_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS eoskit_outbox_slots (
	slot  text PRIMARY KEY,
	token text NOT NULL
);`
		if n.name != "" {
			shared = ""
		}
		return `
CREATE TABLE ` + ident(n.table()) + ` (
	id        bigserial PRIMARY KEY,
	topic     text      NOT NULL,
	partition integer,
	key       bytea,
	value     bytea,
	headers   bytea
);
CREATE PUBLICATION ` + ident(n.publication()) + ` FOR TABLE ` + ident(n.table()) + ` WITH (publish = 'insert');
CREATE TABLE ` + ident(n.deadLetters()) + ` (
	id         bigint      PRIMARY KEY,
	topic      text        NOT NULL,
	partition  integer,
	key        bytea,
	value      bytea,
	headers    bytea,
	error      text        NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now()
);` + shared
	},
	// 2: each outbox's own heartbeat and token tables, so that services
	// with roles of their own share a database without rights on each
	// other's tables (the default outbox's are the tables version 1
	// created; a named outbox's token is copied over by Migrate).
	func(n names) string {
		return `
CREATE TABLE IF NOT EXISTS ` + ident(n.relays()) + ` (
	slot    text        PRIMARY KEY,
	pid     integer     NOT NULL,
	beat_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS ` + ident(n.slots()) + ` (
	slot  text PRIMARY KEY,
	token text NOT NULL
);`
	},
}

// SchemaVersion is the schema version this package needs.
const SchemaVersion = 2

// Migrate creates or upgrades an outbox's tables and publication to
// [SchemaVersion], then creates its replication slot if it does not exist:
// the default outbox's, or the one [Name] names, and its slot,
// [DefaultSlot]'s or the one [Slot] names; nothing else (no other
// outbox's slot, which nobody would read, and which would keep the
// server's log for ever). Give it the Name and Slot the relay has. It is
// idempotent and safe to run from several instances at once. Run it
// before the first [Write]: a record written before its slot exists is
// never relayed.
//
// A malformed Name or Slot is an *eoskit.ConfigError before any statement.
// It needs wal_level=logical (else it returns [ErrWALLevel]), and a role
// that may create the tables and publication and has the REPLICATION
// attribute (for the slot).
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...MigrateOption) error {
	n, err := migrateNames(opts)
	if err != nil {
		return err
	}
	if err := checkWALLevel(ctx, pool); err != nil {
		return err
	}
	slot, err := n.slotOf(ctx, pool)
	if err != nil {
		return err
	}
	schema := ident(n.schema())
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// One lock for every outbox: version 1 shares tables between them.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('eoskit.outbox.migrate'))`); err != nil {
			return err
		}
		create := `CREATE TABLE IF NOT EXISTS ` + schema + ` (version integer NOT NULL)`
		if _, err := tx.Exec(ctx, create); err != nil {
			return statementError(create, err)
		}
		var version int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+schema).Scan(&version); err != nil {
			return err
		}
		if version > len(migrations) {
			return fmt.Errorf("the database schema is at version %d, newer than this code's %d: upgrade eoskit", version, len(migrations))
		}
		for v := version; v < len(migrations); v++ {
			// One statement at a time, so that a refusal names the
			// statement refused.
			for _, stmt := range statements(migrations[v](n)) {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("to version %d: %w", v+1, statementError(stmt, err))
				}
			}
			if v+1 == 2 && n.name != "" {
				// The slot's token, from the table version 1 shared
				// (if this role may read it: one that may not never
				// wrote there): its positions in Kafka carry it.
				if _, err := tx.Exec(ctx, `DO $$ BEGIN
					IF (CASE WHEN to_regclass('eoskit_outbox_slots') IS NULL THEN false ELSE has_table_privilege(to_regclass('eoskit_outbox_slots'), 'SELECT') END) THEN
						INSERT INTO `+ident(n.slots())+` SELECT slot, token FROM eoskit_outbox_slots WHERE slot = '`+slot+`' ON CONFLICT DO NOTHING;
					END IF; END $$`); err != nil {
					return fmt.Errorf("to version 2: copy slot %s's token: %w", slot, err)
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+` (version) VALUES ($1)`, v+1); err != nil {
				return fmt.Errorf("to version %d: %w", v+1, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", n.table(), err)
	}
	created, err := createSlot(ctx, pool, slot)
	if err != nil {
		return err
	}
	if created {
		// A new incarnation of the slot: its own token table must forget
		// an earlier one's token, or its position in Kafka would count.
		if _, err := pool.Exec(ctx, `DELETE FROM `+ident(n.slots())+` WHERE slot = $1`, slot); err != nil {
			return fmt.Errorf("outbox: forget slot %s's earlier token: %w", slot, err)
		}
	}
	return nil
}

// statements splits a migration into its statements (none holds a ";"
// of its own).
func statements(sql string) []string {
	var out []string
	for _, stmt := range strings.Split(sql, ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			out = append(out, stmt)
		}
	}
	return out
}

// statementError names the statement err refused, and, for a missing
// right (42501), the right and the grant that gives it.
func statementError(stmt string, err error) error {
	what, _, _ := strings.Cut(stmt, "(")
	what = strings.Join(strings.Fields(what), " ")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		return fmt.Errorf("%s: %w", what, err)
	}
	need := "the right the message names"
	switch {
	case strings.HasPrefix(what, "CREATE TABLE"):
		need = "CREATE on the schema (GRANT CREATE ON SCHEMA public TO the role; PostgreSQL 15 and later no longer grant it to every role)"
	case strings.HasPrefix(what, "CREATE PUBLICATION"):
		need = "CREATE on the database (GRANT CREATE ON DATABASE the_database TO the role)"
	}
	return fmt.Errorf("%s: %w: the role needs %s; docs/outbox.md lists the grants", what, err, need)
}

// migrateNames returns the names opts give, checked.
func migrateNames(opts []MigrateOption) (names, error) {
	var n names
	for _, o := range opts {
		o.migrateOption(&n)
	}
	return n, n.check()
}

// DefaultSlot returns the name of the replication slot [Migrate] creates,
// and a [Relay] reads, given the same [Name] and [Slot]: Slot's if it is
// given; else "eoskit_outbox_", the outbox's Name and "_" if it has one,
// and the database's name: eoskit_outbox_app for the default outbox of
// database app, eoskit_outbox_billing_app for its outbox billing. Slot
// names are shared by every database of a server, so each database gets
// its own; characters a slot name can not hold become _, and a name
// changed so, or longer than 63 bytes, is cut to 54 and ends with a hash
// of the database's name.
func DefaultSlot(ctx context.Context, pool *pgxpool.Pool, opts ...MigrateOption) (string, error) {
	n, err := migrateNames(opts)
	if err != nil {
		return "", err
	}
	return n.slotOf(ctx, pool)
}

// slotOf returns the outbox's slot in pool's database.
func (n names) slotOf(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	if n.slot != "" {
		return n.slot, nil
	}
	var db string
	if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return "", fmt.Errorf("outbox: read the database's name: %w", err)
	}
	return n.slotIn(db), nil
}

// CreateSlot creates the logical replication slot name (plugin pgoutput)
// unless it exists. A relay reads every outbox record committed after its
// slot was created; create a slot before records are written for it. The
// role needs the REPLICATION attribute.
func CreateSlot(ctx context.Context, pool *pgxpool.Pool, name string) error {
	_, err := createSlot(ctx, pool, name)
	return err
}

// createSlot is CreateSlot, reporting whether it created the slot.
func createSlot(ctx context.Context, pool *pgxpool.Pool, name string) (created bool, err error) {
	if !validSlotName(name) {
		return false, fmt.Errorf("outbox: create slot: %q is not a replication slot name", name)
	}
	if err := checkWALLevel(ctx, pool); err != nil {
		return false, err
	}
	err = pool.QueryRow(ctx, `SELECT count(pg_create_logical_replication_slot($1, 'pgoutput')) > 0
		WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, name).Scan(&created)
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42710") { // 42710: created meanwhile
		return false, fmt.Errorf("outbox: create replication slot %s: %w", name, err)
	}
	if created {
		// A new incarnation: positions in Kafka of an earlier slot of
		// this name (a server restored from a backup, which does not
		// keep slots) must not count for it.
		// The outbox is not known here: every outbox's token table
		// this role may write forgets the slot's name.
		if _, err := pool.Exec(ctx, `DO $$ DECLARE t regclass; BEGIN
			FOR t IN SELECT c.oid::regclass FROM pg_class c
				WHERE c.relkind = 'r' AND c.relname LIKE 'eoskit\_outbox%\_slots' AND pg_table_is_visible(c.oid) AND has_table_privilege(c.oid, 'DELETE')
			LOOP
				EXECUTE format('DELETE FROM %s WHERE slot = %L', t, '`+name+`');
			END LOOP; END $$`); err != nil {
			return false, fmt.Errorf("outbox: forget slot %s's earlier token: %w", name, err)
		}
	}
	// Slot names are the server's, not the database's: one of another
	// database's, or of another plugin, is not this outbox's.
	var db, plugin *string
	var here string
	if err := pool.QueryRow(ctx, `SELECT s.database, s.plugin, current_database() FROM pg_replication_slots s WHERE s.slot_name = $1`, name).Scan(&db, &plugin, &here); err != nil {
		return false, fmt.Errorf("outbox: look up replication slot %s: %w", name, err)
	}
	if db == nil || *db != here || plugin == nil || *plugin != "pgoutput" {
		return false, fmt.Errorf("outbox: replication slot %s exists, but for database %v and plugin %v, not %s and pgoutput: name another with outbox.Slot", name, deref(db), deref(plugin), here)
	}
	return created, nil
}

func deref(s *string) string {
	if s == nil {
		return "(none)"
	}
	return *s
}

// DropSlot drops the replication slot name, if it exists and no relay is
// reading it. PostgreSQL keeps the write-ahead log a slot still needs, so
// a slot nobody reads any more must be dropped; records written for it and
// not yet relayed are then never relayed.
func DropSlot(ctx context.Context, pool *pgxpool.Pool, name string) error {
	_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
	if err != nil {
		return fmt.Errorf("outbox: drop replication slot %s: %w", name, err)
	}
	return nil
}

// checkWALLevel returns ErrWALLevel unless the server decodes logically.
func checkWALLevel(ctx context.Context, pool *pgxpool.Pool) error {
	var level string
	if err := pool.QueryRow(ctx, `SHOW wal_level`).Scan(&level); err != nil {
		return fmt.Errorf("outbox: read wal_level: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("%w (it is %q)", ErrWALLevel, level)
	}
	return nil
}

// checkReady returns a clear error unless the server is recent enough
// (pgoutput's binary mode: PostgreSQL 14) and the outbox's schema (its
// tables and publication) and its slot are in place.
func checkReady(ctx context.Context, pool *pgxpool.Pool, n names) error {
	slot := n.slot
	if err := checkWALLevel(ctx, pool); err != nil {
		return err
	}
	var version int
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return fmt.Errorf("outbox: read the server's version: %w", err)
	}
	if version < 140000 {
		return fmt.Errorf("%w: PostgreSQL %d.%d; the relay needs 14 or newer", ErrSchema, version/10000, version%10000)
	}
	err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+ident(n.schema())).Scan(&version)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		version, err = 0, nil
	}
	if err != nil {
		return fmt.Errorf("outbox: read the schema version: %w", err)
	}
	if version != SchemaVersion {
		return fmt.Errorf("%w: outbox %s has version %d, this code needs %d", ErrSchema, n.table(), version, SchemaVersion)
	}
	var plugin string
	var twoPhase bool
	// two_phase exists from PostgreSQL 14 on: read through jsonb, so that
	// an older server answers false.
	err = pool.QueryRow(ctx, `SELECT s.plugin, coalesce((to_jsonb(s)->>'two_phase')::boolean, false)
		FROM pg_replication_slots s WHERE s.slot_name = $1 AND s.database = current_database()`, slot).Scan(&plugin, &twoPhase)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s (create it with outbox.Migrate or outbox.CreateSlot before writing records)", ErrNoSlot, slot)
	}
	if err != nil {
		return fmt.Errorf("outbox: look up replication slot %s: %w", slot, err)
	}
	if plugin != "pgoutput" {
		return fmt.Errorf("%w: %s uses plugin %s, not pgoutput", ErrNoSlot, slot, plugin)
	}
	if twoPhase {
		// The stream would carry a prepared transaction's records at
		// PREPARE, before it commits or rolls back, which the relay's
		// decoding refuses (BeginPrepare).
		return fmt.Errorf("%w: %s was created with two_phase, and the relay reads committed transactions only: drop it and let outbox.Migrate (or CreateSlot) create it", ErrNoSlot, slot)
	}
	return nil
}
