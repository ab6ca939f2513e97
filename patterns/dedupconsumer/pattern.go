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
// its id was purged (Config.Retention, a week by default).
//
// cmd/dedupconsumer is the program to deploy.
package dedupconsumer

import (
	"context"
	"log/slog"
	"time"

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
	// Instance, when set, is this instance's stable name (a StatefulSet
	// pod's): the group's static membership (dedup.InstanceID), so that
	// a restarted instance gets its partitions back at once instead of
	// after its predecessor's session timeout (45 s by default).
	// Default "": dynamic membership.
	Instance string
	// DeadLetters parks a report the handler cannot apply (one that does
	// not parse, say) in the dead-letter table, in the transaction that
	// claims its id, and goes on (dedup.DeadLetter); `eoskit
	// dead-letters` lists and replays it. Default false: such a report
	// stops Run with a *eoskit.RecordError naming it, and a restart meets
	// it again.
	DeadLetters bool
	// Retention is how long a claimed id is kept: Run purges older ones
	// (PostgresStore.Purge) at its start and every PurgeInterval, so that
	// the id table stays bounded. A copy of a report arriving later than
	// that counts again: keep it longer than the longest redelivery
	// (consumer lag, an offset reset, a replay of the topic). Default:
	// DefaultRetention; negative: never purge.
	Retention time.Duration
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

func (c Config) retention() time.Duration {
	if c.Retention == 0 {
		return DefaultRetention
	}
	return c.Retention
}

func (c Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
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

// DefaultRetention is Config.Retention's default: a week.
const DefaultRetention = 7 * 24 * time.Hour

// PurgeInterval is how often Run purges the ids older than
// Config.Retention.
const PurgeInterval = time.Hour

// purgeBatch bounds the rows one purge transaction deletes.
const purgeBatch = 10_000

// Consumer is one instance: a dedup.Consumer (Health, and the rest of
// its methods) whose Run also purges old ids.
type Consumer struct {
	*dedup.Consumer
	cfg   Config
	store *dedup.PostgresStore
}

// New returns the consumer cfg describes: Run it, and serve its Health to
// probes (package probe).
func New(cfg Config) (*Consumer, error) {
	store, err := cfg.store()
	if err != nil {
		return nil, err
	}
	handler := cfg.Handler
	if handler == nil {
		handler = Handle(cfg.tables())
	}
	opts := []dedup.Option{
		dedup.Brokers(cfg.Brokers...),
		dedup.Group(cfg.Group),
		dedup.Topics(cfg.Topic),
		dedup.Logger(cfg.logger()),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
	}
	if cfg.Instance != "" {
		opts = append(opts, dedup.InstanceID(cfg.Instance))
	}
	if cfg.DeadLetters {
		opts = append(opts, dedup.OnHandlerError(dedup.DeadLetter()))
	}
	c, err := dedup.NewConsumer(cfg.Pool, store, handler, append(opts, cfg.Options...)...)
	if err != nil {
		return nil, err
	}
	return &Consumer{Consumer: c, cfg: cfg, store: store}, nil
}

// Run consumes until ctx ends, then lets the batch in hand commit
// (dedup.DrainTimeout bounds that) and returns nil. A new group reads the
// topic from its start, so that the totals count every report. Beside
// that, it purges the ids older than Config.Retention, at its start and
// every PurgeInterval; a purge that fails is logged and tried again at
// the next.
func (c *Consumer) Run(ctx context.Context) error {
	if c.cfg.retention() < 0 {
		return c.Consumer.Run(ctx)
	}
	purgeCtx, stopPurging := context.WithCancel(ctx)
	purged := make(chan struct{})
	go func() {
		defer close(purged)
		purge(purgeCtx, c.cfg, c.store)
	}()
	err := c.Consumer.Run(ctx)
	stopPurging()
	<-purged
	return err
}

// Run runs the consumer cfg describes (New, then Consumer.Run).
func Run(ctx context.Context, cfg Config) error {
	c, err := New(cfg)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// purge deletes the ids older than cfg's retention now and every
// PurgeInterval until ctx ends.
func purge(ctx context.Context, cfg Config, store *dedup.PostgresStore) {
	tick := time.NewTicker(PurgeInterval)
	defer tick.Stop()
	for {
		n, err := store.Purge(ctx, cfg.Pool, time.Now().Add(-cfg.retention()), purgeBatch)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			cfg.logger().Warn("dedupconsumer: purging old ids failed; trying again later", "err", err, "purged", n)
		case n > 0:
			cfg.logger().Info("dedupconsumer: purged old ids", "purged", n, "retention", cfg.retention())
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
