package outbox

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/deadletter"
)

// DeadLetterRow is a record a relay kept whole in its outbox's dead-letter
// table ([DeadLetterTable], or eoskit_outbox_<name>_dead_letters): one
// Kafka refused as its own fault, with why.
type DeadLetterRow struct {
	ID        int64  // the outbox row's id
	Topic     string // the topic it was for
	Partition *int32 // the partition it was written to; nil: by key
	Key       []byte
	Value     []byte
	Headers   []kgo.RecordHeader
	Error     string
	CreatedAt time.Time
}

// ListDeadLetters returns up to limit rows of the dead-letter table of the
// outbox opts name (none: the default outbox's), oldest first; with ids,
// only those. It needs SELECT on that table: the service's own role.
func ListDeadLetters(ctx context.Context, pool *pgxpool.Pool, limit int, ids []int64, opts ...WriterOption) ([]DeadLetterRow, error) {
	n, err := deadLetterNames(opts)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, `SELECT id, topic, partition, key, value, headers, error, created_at FROM `+ident(n.deadLetters())+`
		WHERE coalesce(cardinality($1::bigint[]), 0) = 0 OR id = ANY($1) ORDER BY id LIMIT $2`, ids, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list %s: %w", n.deadLetters(), err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("outbox: list %s: %w", n.deadLetters(), err)
	}
	return out, nil
}

// ReplayDeadLetters moves rows of the dead-letter table of the outbox
// opts name back into that outbox, so that its relay publishes each once
// more: each row is written again (to toTopic when set, to its partition
// when it named one), with an eoskit-replayed-from header naming its row,
// and deleted in the same database transaction, a batch of 500 at a time
// (rows another replay holds are passed over). With ids, only those rows;
// without, every row there was when it started. It returns how many rows
// it moved, also when it fails. A record that was addressed as a relay's
// position ([ErrPositionRecord]) is refused unless toTopic names another
// topic. It needs the service's own role: SELECT, UPDATE (the rows are
// locked) and DELETE on the dead-letter table, INSERT on the outbox and
// USAGE on its id sequence.
//
// The relay sends every record it dead-letters to its [DeadLetter] topic
// too, with its value unless too large for Kafka: replay each record from
// one of the two, never both. A record replayed is published after the
// records written since it was dead-lettered: on a compacted topic, a
// newer value of its key is overwritten. A row is written when its batch
// is published; a batch whose Kafka transaction then aborted leaves it
// behind, and the relay's retry publishes (or dead-letters) the record
// again: replay while the relay runs and keeps up, not while it retries.
func ReplayDeadLetters(ctx context.Context, pool *pgxpool.Pool, ids []int64, toTopic string, opts ...WriterOption) (int, error) {
	n, err := deadLetterNames(opts)
	if err != nil {
		return 0, err
	}
	var maxID int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+ident(n.deadLetters())).Scan(&maxID); err != nil {
		return 0, fmt.Errorf("outbox: replay %s: %w", n.deadLetters(), err)
	}
	done := 0
	for {
		moved := 0
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT id, topic, partition, key, value, headers, error, created_at FROM `+ident(n.deadLetters())+`
				WHERE id <= $1 AND (coalesce(cardinality($2::bigint[]), 0) = 0 OR id = ANY($2)) ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED`, maxID, ids)
			if err != nil {
				return err
			}
			letters, err := pgx.CollectRows(rows, scanDeadLetter)
			if err != nil || len(letters) == 0 {
				return err
			}
			recs := make([]*kgo.Record, len(letters))
			partitions := make([]*int32, len(letters))
			rowIDs := make([]int64, len(letters))
			for i, l := range letters {
				if toTopic == "" && strings.Contains(l.Error, ErrPositionRecord.Error()) {
					return fmt.Errorf("row %d was addressed as a relay's position: name the topic to replay it to", l.ID)
				}
				from := fmt.Sprintf("%s/%d %s", n.deadLetters(), l.ID, l.Topic)
				recs[i] = &kgo.Record{Topic: cmp.Or(toTopic, l.Topic), Key: l.Key, Value: l.Value,
					Headers: append(l.Headers, kgo.RecordHeader{Key: deadletter.ReplayedFromHeader, Value: []byte(from)})}
				if toTopic == "" {
					partitions[i] = l.Partition
				}
				rowIDs[i] = l.ID
			}
			// One statement each: the rows back in the outbox, in order,
			// and gone from the dead-letter table.
			if err := writeRows(ctx, tx, n.table(), partitions, recs); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `DELETE FROM `+ident(n.deadLetters())+` WHERE id = ANY($1)`, rowIDs); err != nil {
				return err
			}
			moved = len(letters)
			return nil
		})
		if err != nil {
			return done, fmt.Errorf("outbox: replay %s (%d replayed before): %w", n.deadLetters(), done, err)
		}
		if moved == 0 {
			return done, nil
		}
		done += moved
	}
}

func deadLetterNames(opts []WriterOption) (names, error) {
	var n names
	for _, o := range opts {
		o.writerOption(&n)
	}
	return n, n.check()
}

func scanDeadLetter(r pgx.CollectableRow) (DeadLetterRow, error) {
	var l DeadLetterRow
	var headers []byte
	if err := r.Scan(&l.ID, &l.Topic, &l.Partition, &l.Key, &l.Value, &headers, &l.Error, &l.CreatedAt); err != nil {
		return l, err
	}
	var err error
	if l.Headers, err = decodeHeaders(headers); err != nil {
		return l, fmt.Errorf("row %d: %w", l.ID, err)
	}
	return l, nil
}
