package offsetstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/internal/loop"
)

// The stored positions: what every assignment seeks to (the offsets
// stored in PostgreSQL, checked against the topic's ID), and what a
// revoke forgets.

// seekToStored runs on every assignment, before any record of the assigned
// partitions is fetched: it replaces the offsets Kafka holds for the group
// with those stored in PostgreSQL, or the reset point where none is stored.
func (r *Runner) seekToStored(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, map[string]map[int32]int64, error) {
	topics := make([]string, 0, len(offsets))
	for t := range offsets {
		topics = append(topics, t)
	}
	var stored map[topicPartition]int64
	var oldRows map[topicPartition]pgtype.UUID
	var ids map[string]pgtype.UUID
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		if ids, err = r.currentTopicIDs(ctx, topics); err == nil {
			stored, oldRows, err = r.loadRows(ctx, topics, ids)
		}
		if err == nil || ctx.Err() != nil {
			break
		}
		r.cfg.core.Logger.Warn("offsetstore: reading stored offsets failed; retrying", "err", err, "attempt", attempt)
		if !loop.Sleep(ctx, time.Duration(attempt)*200*time.Millisecond) {
			break
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("offsetstore: read stored offsets: %w", err)
	}
	found := map[string]map[int32]int64{}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range topics {
		if id, ok := ids[t]; ok {
			r.topicIDs[t] = id
		} else {
			delete(r.topicIDs, t) // unknown now: no older ID is trusted
		}
	}
	for t, parts := range offsets {
		for p := range parts {
			tp := topicPartition{t, p}
			if id, ok := oldRows[tp]; ok {
				r.oldRows[tp] = id
			} else {
				delete(r.oldRows, tp)
			}
			if next, ok := stored[tp]; ok {
				// Epoch -1: the stored offset carries no leader epoch,
				// and must not trigger franz-go's data-loss detection.
				parts[p] = kgo.NewOffset().At(next).WithEpoch(-1)
				r.positions[tp] = next
				if found[t] == nil {
					found[t] = map[int32]int64{}
				}
				found[t][p] = next
			} else {
				parts[p] = r.cfg.reset
				r.positions[tp] = noRow
			}
		}
	}
	r.cfg.core.Logger.Info("offsetstore: assigned; positioned at stored offsets", "offsets", loop.FormatOffsets(offsets))
	return offsets, found, nil
}

// load reads the stored offsets of topics. A row stored for another topic
// of the same name (its ID differs from ids: the topic was deleted and
// created again) is left out, as if none were stored; a row with no ID
// (stored before IDs were) is trusted.
func (r *Runner) load(ctx context.Context, topics []string, ids map[string]pgtype.UUID) (map[topicPartition]int64, error) {
	stored, _, err := r.loadRows(ctx, topics, ids)
	return stored, err
}

// loadRows is load that also returns the rows it left out, with their
// topic IDs.
func (r *Runner) loadRows(ctx context.Context, topics []string, ids map[string]pgtype.UUID) (map[topicPartition]int64, map[topicPartition]pgtype.UUID, error) {
	rows, err := r.pool.Query(ctx, `SELECT topic, partition, next_offset, topic_id FROM eoskit_offsets WHERE consumer_group = $1 AND topic = ANY($2)`, r.cfg.core.Group, topics)
	if err != nil {
		return nil, nil, err
	}
	stored := map[topicPartition]int64{}
	old := map[topicPartition]pgtype.UUID{}
	var t string
	var p int32
	var next int64
	var id pgtype.UUID
	_, err = pgx.ForEachRow(rows, []any{&t, &p, &next, &id}, func() error {
		if current := ids[t]; id.Valid && current.Valid && id != current {
			r.cfg.core.Logger.Warn("offsetstore: the stored offset belongs to an earlier topic of this name (deleted and created again); reading the new one from the reset point",
				"topic", t, "partition", p, "stored_offset", next)
			old[topicPartition{t, p}] = id
			return nil
		}
		stored[topicPartition{t, p}] = next
		return nil
	})
	return stored, old, err
}

// checkSchema refuses a database whose offsetstore schema is older than
// this code's: every assignment would fail on it.
func (r *Runner) checkSchema(ctx context.Context) error {
	var version int
	err := r.pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM eoskit_offsetstore_schema`).Scan(&version)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		version = 0
	case err != nil:
		return fmt.Errorf("offsetstore: read the schema version: %w", err)
	}
	if version < SchemaVersion {
		return &eoskit.ConfigError{Package: "offsetstore", Setting: "database schema", Reason: fmt.Sprintf("at version %d, this code needs %d: run offsetstore.Migrate", version, SchemaVersion)}
	}
	if !r.cfg.policy.DeadLetters() {
		return nil
	}
	// The dead-letter table gains columns without a schema version (dedup's
	// Migrate creates it too): an earlier eoskit's table would fail the
	// first park.
	switch ok, err := deadletter.Exists(ctx, r.pool); {
	case err != nil:
		return fmt.Errorf("offsetstore: look up %s: %w", deadletter.Table, err)
	case !ok:
		return &eoskit.ConfigError{Package: "offsetstore", Setting: "OnHandlerError", Reason: "DeadLetter parks records in " + deadletter.Table + ", which lacks the columns of this eoskit: run offsetstore.Migrate"}
	}
	return nil
}

// currentTopicIDs returns the topics' IDs from the cluster's metadata
// (invalid where the cluster has none).
func (r *Runner) currentTopicIDs(ctx context.Context, topics []string) (map[string]pgtype.UUID, error) {
	adm := r.admin.Load()
	if adm == nil {
		return nil, errors.New("the runner is starting")
	}
	details, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("topic IDs: %w", err)
	}
	ids := map[string]pgtype.UUID{}
	for _, t := range topics {
		d, ok := details[t]
		if ok && d.Err == nil && d.ID != (kadm.TopicID{}) {
			ids[t] = pgtype.UUID{Bytes: d.ID, Valid: true}
		}
	}
	return ids, nil
}

// forget drops the stored positions of partitions the group took
// (revoked or lost), once their batches ended.
func (r *Runner) forget(parts map[string][]int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t, ps := range parts {
		for _, p := range ps {
			delete(r.positions, topicPartition{t, p})
		}
	}
}
