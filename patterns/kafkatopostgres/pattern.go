// Package kafkatopostgres is the exactly-once Kafka→PostgreSQL pattern: an
// offsetstore.Runner reads case reports and, for each batch, stores the
// reports, adds them to their regions' totals and records the batch's
// offsets, all in one database transaction.
//
// What it guarantees: each report in the topic counts once in the totals,
// whatever the crashes, rebalances and stalled instances: the rows and the
// offsets commit together or not at all, and a restarted or reassigned
// consumer resumes from the offsets in the database, not from Kafka's.
//
// What breaks it: a write outside the handler's tx (it is not rolled back
// with the batch, and is repeated); a producer upstream that duplicates
// (the topic then holds a report twice, and both count: feed it an
// idempotent, transactional or resume producer, or use dedupconsumer);
// resetting the offsets in Kafka (they are not the ones used).
//
// cmd/kafkatopostgres is the program to deploy.
package kafkatopostgres

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/patterns/dashboard"
)

// Config is one instance's configuration.
type Config struct {
	// Pool is the dashboard's database; it also holds the offsets.
	Pool *pgxpool.Pool
	// Brokers are the Kafka bootstrap addresses.
	Brokers []string
	// Group is the consumer group, shared by every instance.
	Group string
	// Topic is the topic of incoming reports.
	Topic string
	// Tables prefixes the dashboard's tables. Default:
	// dashboard.DefaultTables.
	Tables string
	// Handler applies one batch in its transaction. Default:
	// Handle(Tables).
	Handler offsetstore.Handler
	// Logger receives the runner's logs. Default: slog.Default().
	Logger *slog.Logger
	// Options are further runner options (offsetstore.MaxRecordsPerCommit,
	// offsetstore.DrainTimeout, offsetstore.ClientOptions...), applied
	// after the pattern's own.
	Options []offsetstore.Option
}

func (c Config) tables() string {
	if c.Tables == "" {
		return dashboard.DefaultTables
	}
	return c.Tables
}

// Migrate creates the offsets table and the dashboard's tables. Run it
// once before Run; it is idempotent.
func Migrate(ctx context.Context, cfg Config) error {
	if err := offsetstore.Migrate(ctx, cfg.Pool); err != nil {
		return err
	}
	return dashboard.Migrate(ctx, cfg.Pool, cfg.tables())
}

// Handle is the pattern's handler: every report of the batch stored and
// added to its region's total through tx, which commits with the offsets.
func Handle(tables string) offsetstore.Handler {
	return func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		for _, rec := range recs {
			if err := dashboard.Apply(ctx, tx, tables, rec); err != nil {
				return err
			}
		}
		return nil
	}
}

// Run consumes until ctx ends, then lets the batch in hand commit
// (offsetstore.DrainTimeout bounds that) and returns nil.
func Run(ctx context.Context, cfg Config) error {
	handler, logger := cfg.Handler, cfg.Logger
	if handler == nil {
		handler = Handle(cfg.tables())
	}
	if logger == nil {
		logger = slog.Default()
	}
	opts := append([]offsetstore.Option{
		offsetstore.Brokers(cfg.Brokers...),
		offsetstore.Group(cfg.Group),
		offsetstore.Topics(cfg.Topic),
		offsetstore.Logger(logger),
	}, cfg.Options...)
	r, err := offsetstore.NewRunner(cfg.Pool, handler, opts...)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
