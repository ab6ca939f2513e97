package deadletter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Row is one parked record.
type Row struct {
	ID        int64     `json:"id"`
	Group     string    `json:"group"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Error     string    `json:"error"`
	CreatedAt time.Time `json:"created_at"`
	// KeyBytes and ValueBytes are the sizes of the key and value, which
	// List does not return: an operator's terminal is no place for data.
	KeyBytes   int  `json:"key_bytes"`
	ValueBytes int  `json:"value_bytes"`
	Claimed    bool `json:"claimed"` // a dedup consumer claimed its id
	// ParkedBy is "offsetstore" or "dedup"; "" for a row an earlier
	// eoskit parked, which kept neither headers nor claim.
	ParkedBy string `json:"parked_by"`
}

// Filter picks rows: every field set must match; zero fields match all.
type Filter struct {
	Group string
	Topic string
	IDs   []int64
	// Earlier lets Replay take rows an earlier eoskit parked (no
	// parked_by): their headers are lost, and if dedup parked one, its id
	// is still claimed and the replayed record will be skipped as a copy
	// unless the claim is deleted by hand.
	Earlier bool
}

// where matches f and ids up to maxID ($4).
func (f Filter) where(maxID int64) (string, []any) {
	ids := f.IDs
	if ids == nil {
		ids = []int64{} // NULL would match nothing
	}
	return `($1 = '' OR consumer_group = $1) AND ($2 = '' OR topic = $2) AND (cardinality($3::bigint[]) = 0 OR id = ANY($3)) AND id <= $4`,
		[]any{f.Group, f.Topic, ids, maxID}
}

// ErrEarlierRows is returned by Replay for rows an earlier eoskit parked,
// unless Filter.Earlier lets it take them.
var ErrEarlierRows = errors.New("rows parked by an earlier eoskit, which kept no dedup claim: a replay of one dedup parked would be skipped as a copy")

// List returns up to limit rows matching f, oldest first.
func List(ctx context.Context, pool *pgxpool.Pool, f Filter, limit int) ([]Row, error) {
	where, args := f.where(math.MaxInt64)
	rows, err := pool.Query(ctx, `SELECT id, consumer_group, topic, partition, "offset", error, created_at,
		coalesce(length(key), 0), coalesce(length(value), 0), claim_id IS NOT NULL, coalesce(parked_by, '')
		FROM eoskit_dead_letters WHERE `+where+` ORDER BY id LIMIT `+strconv.Itoa(limit), args...)
	if err != nil {
		return nil, fmt.Errorf("deadletter: list %s: %w", Table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var row Row
		err := r.Scan(&row.ID, &row.Group, &row.Topic, &row.Partition, &row.Offset, &row.Error, &row.CreatedAt,
			&row.KeyBytes, &row.ValueBytes, &row.Claimed, &row.ParkedBy)
		return row, err
	})
	if err != nil {
		return nil, fmt.Errorf("deadletter: list %s: %w", Table, err)
	}
	return out, nil
}

// Write stores records so that they reach Kafka if and only if tx commits
// (outbox.Write, or a named outbox's).
type Write func(ctx context.Context, tx pgx.Tx, records ...*kgo.Record) error

// ReplayedFromHeader is added to each replayed record: the table, row id
// and coordinates it was parked from, so that a consumer can tell a
// replay from the original.
const ReplayedFromHeader = "eoskit-replayed-from"

// ReplayBatch is how many rows one replay transaction moves.
const ReplayBatch = 100

// Replay moves the rows matching f that exist when it starts into the
// outbox through write, a batch of rows per database transaction that
// writes their records, releases their dedup claims and deletes them: a
// row is replayed once, or stays parked, whatever crashes (its
// transaction commits or not), and two replays at once take different
// rows (FOR UPDATE SKIP LOCKED). A replayed record that fails again is
// parked anew, for a later replay. Each record goes to its own topic, or
// to toTopic if set, with its key, value and headers and a
// [ReplayedFromHeader]. A claim is released only if it is the one made
// with the park (its processed_at is the row's created_at: one
// transaction's now()): one purged since and made again by a later copy,
// which was applied, is left, and the replay is then skipped as a copy.
// Rows an earlier eoskit parked are refused ([ErrEarlierRows]) unless
// f.Earlier. It returns how many rows it replayed; done, when it ends
// early with an error, counts what committed.
func Replay(ctx context.Context, pool *pgxpool.Pool, f Filter, toTopic string, write Write) (done int, err error) {
	var maxID int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM eoskit_dead_letters`).Scan(&maxID); err != nil {
		return 0, fmt.Errorf("deadletter: replay from %s: %w", Table, err)
	}
	where, args := f.where(maxID)
	if !f.Earlier {
		var earlier int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM eoskit_dead_letters WHERE `+where+` AND parked_by IS NULL`, args...).Scan(&earlier); err != nil {
			return 0, fmt.Errorf("deadletter: replay from %s: %w", Table, err)
		}
		if earlier > 0 {
			return 0, fmt.Errorf("deadletter: replay from %s: %d %w", Table, earlier, ErrEarlierRows)
		}
	}
	for {
		var n int
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT id, consumer_group, topic, partition, "offset", key, value, headers, created_at,
				claim_schema, claim_table, claim_scope, claim_id
				FROM eoskit_dead_letters WHERE `+where+` ORDER BY id LIMIT `+strconv.Itoa(ReplayBatch)+` FOR UPDATE SKIP LOCKED`, args...)
			if err != nil {
				return err
			}
			parked, err := pgx.CollectRows(rows, scanParked)
			if err != nil {
				return err
			}
			if n = len(parked); n == 0 {
				return nil
			}
			recs := make([]*kgo.Record, n)
			ids := make([]int64, n)
			claimTables := map[string]error{} // each checked once a batch
			for i, p := range parked {
				recs[i], ids[i] = p.record(toTopic), p.id
				if p.claim == nil {
					continue
				}
				if !plainIdentifier.MatchString(p.claim.Table) || !plainIdentifier.MatchString(p.claimSchema) {
					return fmt.Errorf("row %d names the claim table %q.%q, which is no plain identifier", p.id, p.claimSchema, p.claim.Table)
				}
				// The row is anyone's to write who may park; the replay runs
				// with the operator's rights: it deletes only from a table
				// its owner marked as a claim table.
				table := pgx.Identifier{p.claimSchema, p.claim.Table}.Sanitize()
				refused, checked := claimTables[table]
				if !checked {
					refused = checkClaimTable(ctx, tx, table)
					claimTables[table] = refused
				}
				if refused != nil {
					return fmt.Errorf("row %d: %w", p.id, refused)
				}
				if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE scope = $1 AND id = $2 AND processed_at = $3`,
					p.claim.Scope, p.claim.ID, p.parkedAt); err != nil {
					return fmt.Errorf("release the claim of row %d: %w", p.id, err)
				}
			}
			if err := write(ctx, tx, recs...); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `DELETE FROM eoskit_dead_letters WHERE id = ANY($1)`, ids)
			return err
		})
		if err != nil {
			return done, fmt.Errorf("deadletter: replay from %s (%d replayed before): %w", Table, done, err)
		}
		if n == 0 {
			return done, nil
		}
		done += n
	}
}

// checkClaimTable refuses table (quoted) unless its owner marked it as a
// claim table, and it runs no code of its owner's on a DELETE: the row
// naming it is anyone's to write who may park, and the replay runs with
// the operator's rights.
func checkClaimTable(ctx context.Context, tx pgx.Tx, table string) error {
	var mark *string
	var plain bool
	if err := tx.QueryRow(ctx, `SELECT obj_description(c.oid, 'pg_class'),
			c.relkind = 'r' AND NOT c.relrowsecurity AND NOT c.relhasrules
			AND NOT EXISTS (SELECT FROM pg_trigger g WHERE g.tgrelid = c.oid AND NOT g.tgisinternal)
		FROM pg_class c WHERE c.oid = to_regclass($1)`, table).Scan(&mark, &plain); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read the mark of its claim table %s: %w", table, err)
	}
	switch {
	case mark == nil || *mark != ClaimTableMark:
		return fmt.Errorf("it names the claim table %s, which its owner did not mark as one (dedup's Migrate marks its ids table; run it, as the table's owner): not releasing a claim there", table)
	case !plain:
		// A trigger, a rule or a row-security policy would run its
		// owner's code with the operator's rights.
		return fmt.Errorf("it names the claim table %s, which has triggers, rules or row security (a claim table has none): not releasing a claim there", table)
	}
	return nil
}

// ClaimTableMark is the comment a claim table's owner gives it (dedup's
// Migrate, MarkClaimTable): a replay releases claims in no other table.
const ClaimTableMark = "eoskit dedup claims"

// MarkClaimTable marks table (quoted, as SQL names it) as a claim table,
// which only its owner may do.
func MarkClaimTable(ctx context.Context, tx pgx.Tx, table string) error {
	_, err := tx.Exec(ctx, `COMMENT ON TABLE `+table+` IS '`+ClaimTableMark+`'`)
	return err
}

var plainIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

type parked struct {
	id           int64
	group, topic string
	partition    int32
	offset       int64
	key, value   []byte
	headers      []kgo.RecordHeader
	parkedAt     time.Time
	claim        *Claim // nil: none kept
	claimSchema  string
}

func scanParked(r pgx.CollectableRow) (parked, error) {
	var p parked
	var rawHeaders, claimID []byte
	var schema, table, scope *string
	if err := r.Scan(&p.id, &p.group, &p.topic, &p.partition, &p.offset, &p.key, &p.value, &rawHeaders, &p.parkedAt,
		&schema, &table, &scope, &claimID); err != nil {
		return p, err
	}
	var err error
	if p.headers, err = decodeHeaders(rawHeaders); err != nil {
		return p, fmt.Errorf("row %d: %w", p.id, err)
	}
	if table != nil && scope != nil && claimID != nil {
		if schema == nil {
			return p, fmt.Errorf("row %d: its claim table %q was not found when it was parked", p.id, *table)
		}
		p.claim, p.claimSchema = &Claim{Table: *table, Scope: *scope, ID: claimID}, *schema
	}
	return p, nil
}

func (p parked) record(toTopic string) *kgo.Record {
	topic := p.topic
	if toTopic != "" {
		topic = toTopic
	}
	from := fmt.Sprintf("%s/%d %s[%d]@%d (group %s)", Table, p.id, p.topic, p.partition, p.offset, p.group)
	return &kgo.Record{Topic: topic, Key: p.key, Value: p.value,
		Headers: append(p.headers, kgo.RecordHeader{Key: ReplayedFromHeader, Value: []byte(from)})}
}
