// Package deadletter is the dead-letter table that eoskit's database
// runners (offsetstore.Runner, dedup.Consumer) park records in, under the
// DeadLetter error policy: one table, created by either package's
// migration, written in the same transaction that stores the record's
// offset or claims its id; and the operator's side of it (replay.go):
// listing what is parked and replaying it, exactly once, through the
// outbox.
package deadletter

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Table is the dead-letter table's name.
const Table = "eoskit_dead_letters"

// Create creates the table in tx unless it exists, and adds the columns
// an earlier eoskit's table lacks, under a lock that both packages'
// migrations take for it (each runs under a lock of its own, and two
// CREATE TABLE IF NOT EXISTS at once can still collide). Its first
// columns are the ones offsetstore's first migration created.
func Create(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('eoskit.dead_letters.create'))`); err != nil {
		return err
	}
	// ALTER TABLE takes an exclusive lock even when there is nothing to
	// add, which would queue every park behind a deploy's Migrate.
	if ok, err := Exists(ctx, tx); err != nil || ok {
		return err
	}
	_, err := tx.Exec(ctx, tableDDL)
	return err
}

type querier interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}

// Exists reports whether the table exists with every column Park writes
// (false for one an earlier eoskit created, before its Migrate ran again).
func Exists(ctx context.Context, q querier) (bool, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = to_regclass('eoskit_dead_letters') AND attname = ANY($1) AND NOT attisdropped`, laterColumns).Scan(&n)
	return n == len(laterColumns), err
}

// laterColumns are the columns added after the table's first version.
var laterColumns = []string{"headers", "parked_by", "claim_schema", "claim_table", "claim_scope", "claim_id", "topic_id"}

// The table's columns, as the package docs of offsetstore and dedup
// list them for operators.
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
);
ALTER TABLE eoskit_dead_letters
	ADD COLUMN IF NOT EXISTS headers      jsonb,
	ADD COLUMN IF NOT EXISTS parked_by    text,
	ADD COLUMN IF NOT EXISTS claim_schema text,
	ADD COLUMN IF NOT EXISTS claim_table  text,
	ADD COLUMN IF NOT EXISTS claim_scope  text,
	ADD COLUMN IF NOT EXISTS claim_id     bytea,
	ADD COLUMN IF NOT EXISTS topic_id     uuid;
DO $$
DECLARE c name;
BEGIN
	-- The first version's UNIQUE (consumer_group, topic, partition,
	-- "offset"), whatever its name: a re-created topic's record must be
	-- parked beside the old topic's.
	FOR c IN SELECT con.conname FROM pg_constraint con
		WHERE con.conrelid = 'eoskit_dead_letters'::regclass AND con.contype = 'u'
		AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
			WHERE a.attrelid = con.conrelid AND a.attnum = ANY (con.conkey)) = ARRAY['consumer_group', 'offset', 'partition', 'topic']
	LOOP
		EXECUTE format('ALTER TABLE eoskit_dead_letters DROP CONSTRAINT %I', c);
	END LOOP;
END $$;
CREATE UNIQUE INDEX IF NOT EXISTS eoskit_dead_letters_record
	ON eoskit_dead_letters (consumer_group, topic, (coalesce(topic_id, '00000000-0000-0000-0000-000000000000')), partition, "offset")`

// Claim is the id a dedup consumer claimed for a record it parked, in the
// same transaction: a later copy of the record is then skipped, and a
// replay must release the claim for the replayed record to be applied.
type Claim struct {
	Table string // the dedup store's table, a plain identifier (its schema is looked up as the park resolves it)
	Scope string
	ID    []byte
}

// Park writes rec, with why it failed, in tx. A record parked before (read
// again after its group's offsets were reset, say) is left as it was, so
// that parking it again does not fail its batch for good; a record of a
// topic deleted and created again under the same name is another record,
// told by topicID (the topic's ID as its fetch named it; zero when the
// broker names none), and parked beside the old topic's. The key, value
// and headers are stored as they came (headers as JSON, each value in
// base64); the error's text as [Text] makes it, since PostgreSQL refuses a
// text holding a NUL or bytes that are not UTF-8, and the record could
// then never be parked (header keys are text too). by names the runner
// ("offsetstore", "dedup"): a row without it was parked by an earlier
// eoskit, which kept no claim (see [Replay]). claim, if not nil, is the id
// claimed for rec.
func Park(ctx context.Context, tx pgx.Tx, by, group string, rec *kgo.Record, topicID [16]byte, cause error, claim *Claim) error {
	args, err := parkArgs(by, group, rec, topicID, cause, claim)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, parkSQL, args...)
	return err
}

// QueuePark is [Park] queued in b, for a runner that sends it with other
// statements in one round trip; b's results report its error.
func QueuePark(b *pgx.Batch, by, group string, rec *kgo.Record, topicID [16]byte, cause error, claim *Claim) error {
	args, err := parkArgs(by, group, rec, topicID, cause, claim)
	if err != nil {
		return err
	}
	b.Queue(parkSQL, args...)
	return nil
}

// parkSQL parks a record; the claim table's schema is the one this
// transaction resolves it in, so that a replay with another search_path
// releases the same claim. A row parked without a topic ID (by an earlier
// eoskit, or through a broker that named none) is the same record at the
// same coordinates: not parked again beside it. ON CONFLICT names no
// target, so that a table an earlier eoskit keyed otherwise takes it too.
const parkSQL = `INSERT INTO eoskit_dead_letters (consumer_group, topic, partition, "offset", key, value, headers, error,
			parked_by, claim_schema, claim_table, claim_scope, claim_id, topic_id)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9,
			(SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($10)),
			$11, $12, $13, $14
		WHERE NOT EXISTS (SELECT FROM eoskit_dead_letters d WHERE d.consumer_group = $1 AND d.topic = $2
			AND d.partition = $3 AND d."offset" = $4 AND d.topic_id IS NULL)
		ON CONFLICT DO NOTHING`

func parkArgs(by, group string, rec *kgo.Record, topicID [16]byte, cause error, claim *Claim) ([]any, error) {
	headers, err := encodeHeaders(rec.Headers)
	if err != nil {
		return nil, err
	}
	var ct, cs, quoted *string
	var cid []byte
	if claim != nil {
		q := pgx.Identifier{claim.Table}.Sanitize()
		ct, cs, cid, quoted = &claim.Table, &claim.Scope, claim.ID, &q
	}
	id := pgtype.UUID{Bytes: topicID, Valid: topicID != [16]byte{}}
	return []any{group, rec.Topic, rec.Partition, rec.Offset, rec.Key, rec.Value, headers, Text(cause.Error()), by, quoted, ct, cs, cid, id}, nil
}

// header is one record header as the headers column holds it.
type header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"` // base64; null for a nil value
}

func encodeHeaders(hs []kgo.RecordHeader) ([]byte, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	out := make([]header, len(hs))
	for i, h := range hs {
		out[i] = header{Key: Text(h.Key), Value: h.Value}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("deadletter: encode headers: %w", err)
	}
	return b, nil
}

func decodeHeaders(b []byte) ([]kgo.RecordHeader, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var in []header
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("deadletter: malformed headers column: %w", err)
	}
	hs := make([]kgo.RecordHeader, len(in))
	for i, h := range in {
		hs[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return hs, nil
}

// Text returns s as a PostgreSQL text column takes it: each NUL byte, and
// each run of bytes that are not UTF-8, replaced by U+FFFD (the Unicode
// replacement character); valid text is returned as it is.
func Text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
