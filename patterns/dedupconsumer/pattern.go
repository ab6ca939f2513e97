// Package dedupconsumer is the effectively-once pattern: an at-least-once
// consumer (dedup.Consumer) whose handler stores each case report and adds
// it to its region's total in the same database transaction that claims
// the report's message id, so that a report delivered twice counts once.
//
// What it guarantees: each message id counts once in the totals, even when
// the producer resends after an unknown outcome (a lost acknowledgement)
// and the consumer crashes, rebalances or stalls: a second delivery finds
// its id claimed and is skipped, and a claim rolls back with the rows it
// came with.
//
// What breaks it: a producer that stamps a resend with a new id (stamp
// once, with dedup.Stamp, and resend that same record); a write outside the
// handler's tx (not rolled back with the claim); two reports given the
// same id (the second is dropped as a duplicate); a copy that arrives after
// its id was purged (dedup's retention horizon).
//
// cmd/dedupconsumer is the program to deploy.
package dedupconsumer

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/patterns/dashboard"
)

// Config is one instance's configuration.
type Config struct {
	// Pool is the dashboard's database; it also holds the claimed ids.
	Pool *pgxpool.Pool
	// Brokers are the Kafka bootstrap addresses.
	Brokers []string
	// Group is the consumer group, shared by every instance.
	Group string
	// Topic is the topic of incoming, dedup.Stamp-ed reports.
	Topic string
	// Tables prefixes the dashboard's tables and the id table
	// (<Tables>_ids). Default: dashboard.DefaultTables.
	Tables string
	// Handler applies one report in the transaction that claims its id.
	// Default: Handle(Tables).
	Handler dedup.Handler
	// Logger receives the consumer's logs. Default: slog.Default().
	Logger *slog.Logger
	// Options are further consumer options (dedup.MaxRecordsPerCommit,
	// dedup.DrainTimeout, dedup.ClientOptions...), applied after the
	// pattern's own.
	Options []dedup.Option
}

func (c Config) tables() string {
	if c.Tables == "" {
		return dashboard.DefaultTables
	}
	return c.Tables
}

func (c Config) store() (*dedup.PostgresStore, error) {
	return dedup.NewPostgresStore(c.tables() + "_ids")
}

// Migrate creates the dashboard's tables and the id table. Run it once
// before Run; it is idempotent.
func Migrate(ctx context.Context, cfg Config) error {
	store, err := cfg.store()
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx, cfg.Pool); err != nil {
		return err
	}
	return dashboard.Migrate(ctx, cfg.Pool, cfg.tables())
}

// Handle is the pattern's handler: the report stored and added to its
// region's total through tx, which commits with the report's claimed id.
func Handle(tables string) dedup.Handler {
	return func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		return dashboard.Apply(ctx, tx, tables, rec)
	}
}

// Run consumes until ctx ends, then lets the batch in hand commit
// (dedup.DrainTimeout bounds that) and returns nil. A new group reads the
// topic from its start, so that the totals count every report.
func Run(ctx context.Context, cfg Config) error {
	store, err := cfg.store()
	if err != nil {
		return err
	}
	handler, logger := cfg.Handler, cfg.Logger
	if handler == nil {
		handler = Handle(cfg.tables())
	}
	if logger == nil {
		logger = slog.Default()
	}
	opts := append([]dedup.Option{
		dedup.Brokers(cfg.Brokers...),
		dedup.Group(cfg.Group),
		dedup.Topics(cfg.Topic),
		dedup.Logger(logger),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
	}, cfg.Options...)
	c, err := dedup.NewConsumer(cfg.Pool, store, handler, opts...)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}
