package deadletter

import (
	"context"
	"fmt"
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
}

// Filter picks rows: every field set must match; zero fields match all.
type Filter struct {
	Group string
	Topic string
	IDs   []int64
}

func (f Filter) where() (string, []any) {
	ids := f.IDs
	if ids == nil {
		ids = []int64{} // NULL would match nothing
	}
	return `($1 = '' OR consumer_group = $1) AND ($2 = '' OR topic = $2) AND (cardinality($3::bigint[]) = 0 OR id = ANY($3))`,
		[]any{f.Group, f.Topic, ids}
}

// List returns up to limit rows matching f, oldest first.
func List(ctx context.Context, pool *pgxpool.Pool, f Filter, limit int) ([]Row, error) {
	where, args := f.where()
	rows, err := pool.Query(ctx, `SELECT id, consumer_group, topic, partition, "offset", error, created_at,
		coalesce(length(key), 0), coalesce(length(value), 0), claim_id IS NOT NULL
		FROM eoskit_dead_letters WHERE `+where+` ORDER BY id LIMIT `+strconv.Itoa(limit), args...)
	if err != nil {
		return nil, fmt.Errorf("deadletter: list %s: %w", Table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var row Row
		err := r.Scan(&row.ID, &row.Group, &row.Topic, &row.Partition, &row.Offset, &row.Error, &row.CreatedAt,
			&row.KeyBytes, &row.ValueBytes, &row.Claimed)
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

// Replay moves the rows matching f into the outbox through write, a batch
// of rows per database transaction that writes their records, releases
// their dedup claims and deletes them: a row is replayed once, or stays
// parked, whatever crashes (its transaction commits or not), and two
// replays at once take different rows (FOR UPDATE SKIP LOCKED). Each
// record goes to its own topic, or to toTopic if set, with its key, value
// and headers and a [ReplayedFromHeader]. It returns how many rows it
// replayed; done, when it ends early with an error, counts what
// committed.
func Replay(ctx context.Context, pool *pgxpool.Pool, f Filter, toTopic string, write Write) (done int, err error) {
	where, args := f.where()
	for {
		var n int
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT id, consumer_group, topic, partition, "offset", key, value, headers, claim_table, claim_scope, claim_id
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
			for i, p := range parked {
				recs[i], ids[i] = p.record(toTopic), p.id
				if p.claim == nil {
					continue
				}
				if !plainIdentifier.MatchString(p.claim.Table) {
					return fmt.Errorf("row %d names the claim table %q, which is no plain identifier", p.id, p.claim.Table)
				}
				if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{p.claim.Table}.Sanitize()+` WHERE scope = $1 AND id = $2`, p.claim.Scope, p.claim.ID); err != nil {
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

var plainIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

type parked struct {
	id               int64
	group, topic     string
	partition        int32
	offset           int64
	key, value       []byte
	headers          []kgo.RecordHeader
	claim            *Claim
	claimT, claimS   *string
	claimID, rawHdrs []byte
}

func scanParked(r pgx.CollectableRow) (parked, error) {
	var p parked
	if err := r.Scan(&p.id, &p.group, &p.topic, &p.partition, &p.offset, &p.key, &p.value, &p.rawHdrs, &p.claimT, &p.claimS, &p.claimID); err != nil {
		return p, err
	}
	var err error
	if p.headers, err = decodeHeaders(p.rawHdrs); err != nil {
		return p, fmt.Errorf("row %d: %w", p.id, err)
	}
	if p.claimT != nil && p.claimS != nil && p.claimID != nil {
		p.claim = &Claim{Table: *p.claimT, Scope: *p.claimS, ID: p.claimID}
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
