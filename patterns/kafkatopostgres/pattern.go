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
	// Instance, when set, is this instance's stable name (a StatefulSet
	// pod's): the group's static membership (offsetstore.InstanceID), so
	// that a restarted instance gets its partitions back at once instead
	// of after its predecessor's session timeout (45 s by default).
	// Default "": dynamic membership.
	Instance string
	// DeadLetters parks a report the handler cannot apply (one that does
	// not parse, say) in the offsets' dead-letter table, in the batch's
	// transaction, and goes on (offsetstore.DeadLetter); `eoskit
	// dead-letters` lists and replays it. Default false: such a report
	// stops Run with a *eoskit.RecordError naming it, and a restart meets
	// it again.
	DeadLetters bool
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
// A report it cannot apply is named (offsetstore.Reject), so that the
// runner blames it alone; an error that is the database's is retried, not
// blamed, whatever is named.
func Handle(tables string) offsetstore.Handler {
	return func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		for _, rec := range recs {
			if err := dashboard.Apply(ctx, tx, tables, rec); err != nil {
				return offsetstore.Reject(rec, err)
			}
		}
		return nil
	}
}

// New returns the runner cfg describes: Run it, and serve its Health to
// probes (package probe).
func New(cfg Config) (*offsetstore.Runner, error) {
	handler, logger := cfg.Handler, cfg.Logger
	if handler == nil {
		handler = Handle(cfg.tables())
	}
	if logger == nil {
		logger = slog.Default()
	}
	opts := []offsetstore.Option{
		offsetstore.Brokers(cfg.Brokers...),
		offsetstore.Group(cfg.Group),
		offsetstore.Topics(cfg.Topic),
		offsetstore.Logger(logger),
	}
	if cfg.Instance != "" {
		opts = append(opts, offsetstore.InstanceID(cfg.Instance))
	}
	if cfg.DeadLetters {
		opts = append(opts, offsetstore.OnHandlerError(offsetstore.DeadLetter()))
	}
	return offsetstore.NewRunner(cfg.Pool, handler, append(opts, cfg.Options...)...)
}

// Run consumes until ctx ends, then lets the batch in hand commit
// (offsetstore.DrainTimeout bounds that) and returns nil.
func Run(ctx context.Context, cfg Config) error {
	r, err := New(cfg)
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
