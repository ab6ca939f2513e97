// Package deadletter is the dead-letter table that eoskit's database
// runners (offsetstore.Runner, dedup.Consumer) park records in, under the
// DeadLetter error policy: one table, created by either package's
// migration, written in the same transaction that stores the record's
// offset or claims its id.
package deadletter

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Create creates the table in tx unless it exists, under a lock that both
// packages' migrations take for it (each runs under a lock of its own,
// and two CREATE TABLE IF NOT EXISTS at once can still collide). Its
// definition is the one offsetstore's first migration created.
func Create(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('eoskit.dead_letters.create'))`); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, tableDDL)
	return err
}

// Exists reports whether the table exists.
func Exists(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT to_regclass('eoskit_dead_letters') IS NOT NULL`).Scan(&ok)
	return ok, err
}

const tableDDL = `
CREATE TABLE IF NOT EXISTS eoskit_dead_letters (
	id             bigserial   PRIMARY KEY,
	consumer_group text        NOT NULL,
	topic          text        NOT NULL,
	partition      integer     NOT NULL,
	"offset"       bigint      NOT NULL,
	key            bytea,
	value          bytea,
	error          text        NOT NULL,
	created_at     timestamptz NOT NULL DEFAULT now(),
	UNIQUE (consumer_group, topic, partition, "offset")
)`

// Park writes rec, with why it failed, in tx. A record parked before (read
// again after its group's offsets were reset, say) is left as it was, so
// that parking it again does not fail its batch for good. The key and value
// are stored as bytes, as they came; the error's text as [Text] makes it,
// since PostgreSQL refuses a text holding a NUL or bytes that are not
// UTF-8, and the record could then never be parked.
func Park(ctx context.Context, tx pgx.Tx, group string, rec *kgo.Record, cause error) error {
	_, err := tx.Exec(ctx, `INSERT INTO eoskit_dead_letters (consumer_group, topic, partition, "offset", key, value, error)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (consumer_group, topic, partition, "offset") DO NOTHING`,
		group, rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value, Text(cause.Error()))
	return err
}

// Text returns s as a PostgreSQL text column takes it: each NUL byte, and
// each run of bytes that are not UTF-8, replaced by U+FFFD (the Unicode
// replacement character); valid text is returned as it is.
func Text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
