package offsetstore

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/loop"
)

// The claim: the compare-and-set on a partition's offsets row that makes
// a batch's commit refuse a stale owner, the advance of the row, and the
// rewind of a partition whose row moved under this owner.

// queueClaim queues the claim of a partition's offsets row for this
// transaction: it locks the row and calls done with the row's offset and
// whether it is where this owner expects it, at expected, of the topic with
// this ID; or, when expected is noRow, creates the row at the batch's first
// offset (a concurrent creator waits on the unique index, then finds it
// taken), replacing only a row left by an earlier topic of the same name,
// seen at assignment (oldRow): a compare-and-set on its ID, so that an owner
// holding a stale ID never overwrites a newer row.
func (r *Runner) queueClaim(b *pgx.Batch, tp topicPartition, id, oldRow pgtype.UUID, expected, first int64, done func(at int64, ok bool)) {
	if expected == noRow {
		b.Queue(`INSERT INTO eoskit_offsets (consumer_group, topic, partition, next_offset, owner, topic_id)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (consumer_group, topic, partition) DO UPDATE
				SET next_offset = EXCLUDED.next_offset, owner = EXCLUDED.owner, topic_id = EXCLUDED.topic_id, updated_at = now()
				WHERE $7::uuid IS NOT NULL AND eoskit_offsets.topic_id = $7::uuid`,
			r.cfg.core.Group, tp.topic, tp.partition, first, r.cfg.owner, id, oldRow,
		).Exec(func(tag pgconn.CommandTag) error {
			done(first, tag.RowsAffected() == 1)
			return nil
		})
		return
	}
	b.Queue(`SELECT next_offset, topic_id FROM eoskit_offsets
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 FOR UPDATE`, r.cfg.core.Group, tp.topic, tp.partition,
	).QueryRow(func(row pgx.Row) error {
		var at int64
		var stored pgtype.UUID
		switch err := row.Scan(&at, &stored); {
		case errors.Is(err, pgx.ErrNoRows):
			done(0, false)
		case err != nil:
			return err
		default:
			sameTopic := !stored.Valid || !id.Valid || stored == id
			done(at, at == expected && sameTopic)
		}
		return nil
	})
}

// advance moves a partition's stored offset, claimed and locked by this
// transaction at from, to next, and records the topic's ID with it.
func (r *Runner) advance(ctx context.Context, tx pgx.Tx, tp topicPartition, id pgtype.UUID, from, next int64) error {
	tag, err := tx.Exec(ctx, `UPDATE eoskit_offsets SET next_offset = $4, owner = $5, updated_at = now(), topic_id = coalesce($7, topic_id)
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND next_offset = $6`,
		r.cfg.core.Group, tp.topic, tp.partition, next, r.cfg.owner, from, id)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("offsetstore: the claimed offsets row of %s[%d] moved under its lock", tp.topic, tp.partition)
	}
	return err
}

// rewind follows a refused batch: it moves the consumer back, for every
// partition the polled batch held and this instance still owns, to where
// the database stands (or, with no row stored, to the batch's first
// record, since nothing before it was ever applied), and drops the records
// buffered since. Whatever this instance still owns then continues from
// the other owner's commit instead of skipping records after its own
// refused ones. It runs while the poll holds the rebalance, so it does not
// race an assignment. The stored offsets are read with retries; if the
// database stays away, Run returns the error rather than go on from an
// unknown position.
func (r *Runner) rewind(ctx context.Context, cl *kgo.Client, stale *staleError, recs []*kgo.Record) error {
	r.cfg.core.Logger.Warn("offsetstore: commit refused; another owner moved these partitions' offsets first (this instance was a zombie); rolled back and rewinding every partition of the batch", "partitions", stale.parts)
	first := map[topicPartition]int64{}
	topics := map[string]bool{}
	for _, rec := range recs {
		tp := topicPartition{rec.Topic, rec.Partition}
		if _, ok := first[tp]; !ok {
			first[tp] = rec.Offset
		}
		topics[rec.Topic] = true
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	var stored map[topicPartition]int64
	var err error
	r.mu.Lock()
	ids := maps.Clone(r.topicIDs)
	owned := false
	for tp := range first {
		_, ok := r.positions[tp]
		owned = owned || ok
	}
	r.mu.Unlock()
	if !owned {
		return nil // the group took them all: their next owner reads from the database
	}
	for attempt := 1; ; attempt++ {
		if stored, err = r.load(ctx, names, ids); err == nil {
			break
		}
		if attempt >= maxDBAttempts || !loop.PauseBeforeRetry(ctx, attempt) {
			return fmt.Errorf("offsetstore: read stored offsets after a refused batch: %w", err)
		}
	}
	set := map[string]map[int32]kgo.EpochOffset{}
	r.mu.Lock()
	for tp, firstOffset := range first {
		if _, owned := r.positions[tp]; !owned {
			continue
		}
		to, ok := stored[tp]
		if ok {
			r.positions[tp] = to
		} else {
			r.positions[tp], to = noRow, firstOffset
		}
		if set[tp.topic] == nil {
			set[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		set[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: -1, Offset: to}
	}
	r.mu.Unlock()
	cl.SetOffsets(set)
	return nil
}

type staleError struct{ parts []topicPartition }

func (e *staleError) Error() string {
	return fmt.Sprintf("offsetstore: stored offsets of %v moved under this owner", e.parts)
}
