// Package outboxrelay is the exactly-once PostgreSQL→Kafka pattern, the
// transactional outbox: the service that takes in case reports writes
// each one into the outbox in the same database transaction as the rest of
// its work ([Submit]), and an outbox.Relay publishes the outbox to Kafka,
// its records and its position in one Kafka transaction.
//
// What it guarantees: every report of a committed database transaction
// reaches the topic once, as read_committed readers (the dashboard) see
// it, and none of a rolled-back one; a region's reports keep the order
// their transactions committed in. A relay that crashes at any point
// (Kafka acknowledged a batch, the slot not yet told) restarts from the
// position committed in Kafka: nothing twice, nothing skipped.
//
// What breaks it: the outbox's slot dropped, advanced by hand or
// invalidated while the relay is down (its records are lost); a failover to
// a replica that lacks the slot; the position topic deleted or re-created
// (the next relay may publish up to one batch again); a reader that reads
// uncommitted. The outbox package's doc lists the rest, and what the
// database and the topics need.
//
// cmd/outboxrelay is the program to deploy.
package outboxrelay

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/patterns/dashboard"
)

// Config is the relay's configuration.
type Config struct {
	// Pool is the database whose outbox is relayed; it needs wal_level =
	// logical and a role with REPLICATION (see package outbox).
	Pool *pgxpool.Pool
	// Brokers are the Kafka bootstrap addresses.
	Brokers []string
	// PositionTopic holds the relay's position: one partition, compacted,
	// created beforehand. Default: outbox.DefaultPositionTopic.
	PositionTopic string
	// Logger receives the relay's logs. Default: slog.Default().
	Logger *slog.Logger
	// Options are further relay options (outbox.CommitInterval,
	// outbox.MaxRecordsPerCommit, outbox.ClientOptions...), applied
	// after the pattern's own.
	Options []outbox.Option
}

// Migrate creates the outbox table, its publication and the database's
// slot. Run it once before the first Submit: reports written before the
// slot existed are never relayed. It is idempotent.
func Migrate(ctx context.Context, cfg Config) error { return outbox.Migrate(ctx, cfg.Pool) }

// Submit writes reports into the outbox for topic, inside the caller's
// transaction tx: they reach Kafka if and only if tx commits, keyed by
// region, in the order given.
func Submit(ctx context.Context, tx pgx.Tx, topic string, reports ...dashboard.Report) error {
	recs := make([]*kgo.Record, len(reports))
	for i, r := range reports {
		recs[i] = r.Record(topic)
	}
	return outbox.Write(ctx, tx, recs...)
}

// New returns the relay cfg describes.
func New(cfg Config) (*outbox.Relay, error) {
	logger, positions := cfg.Logger, cfg.PositionTopic
	if logger == nil {
		logger = slog.Default()
	}
	if positions == "" {
		positions = outbox.DefaultPositionTopic
	}
	opts := append([]outbox.Option{
		outbox.Brokers(cfg.Brokers...),
		outbox.PositionTopic(positions),
		outbox.WithSemantics(eos.ExactlyOnce), // the default, said aloud
		outbox.Logger(logger),
	}, cfg.Options...)
	return outbox.NewRelay(cfg.Pool, opts...)
}

// Run relays until ctx ends, then aborts the Kafka transaction in flight
// (the next run publishes its records) and returns nil.
func Run(ctx context.Context, cfg Config) error {
	r, err := New(cfg)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
