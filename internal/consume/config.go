// Package consume is the consume core of eoskit's database runners
// (offsetstore.Runner and dedup.Consumer): the group client, checked
// against the exactly-once consumer preset (internal/preset, the one
// eos.ExactlyOnce names); the Run guard, health and drain; the poll loop; per-partition pipelines; and the copy to Kafka of
// the offsets a database commit covered. A runner supplies only its
// commit step ([Runner]): offsetstore stores the batch's offsets in the
// database transaction, dedup claims the records' ids there.
//
// Under Concurrency 1 a poll's records are one batch, committed before
// the next poll. Above 1, each partition is a pipeline (a lane): a poll's
// records of a partition go to a batch of their own, committed while the
// poll loop goes on, after the partition's batch before it; a partition
// holding two batches (the one committing and the next) is paused (kgo's
// PauseFetchPartitions) until one is settled, so its records stay in
// offset order while the other partitions keep flowing. Up to Concurrency
// batches commit at once. A revoked or lost partition's batches end
// before the revoke returns, for at most the rebalance timeout (past it,
// the runner's commit step keeps the next owner from applying a record
// twice: see await).
package consume

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/preset"
)

// Config holds the settings every database runner takes; each package's
// options set it.
type Config struct {
	Brokers     []string
	Group       string
	Topics      []string
	MaxPoll     int           // records per poll, so per batch at most
	Concurrency int           // batches committing at once; 1: a poll is one batch
	Drain       time.Duration // how long batches under way may finish once Run's ctx ended
	Logger      *slog.Logger
	Metrics     eoskit.Metrics
	ClientOpts  []kgo.Opt // the user's, checked against the preset
	// ConsumerProtocol: join with Kafka's consumer group protocol
	// (KIP-848); Run checks the cluster serves it well first.
	ConsumerProtocol bool
}

// Defaults returns the defaults every database runner documents.
func Defaults() Config {
	return Config{MaxPoll: 500, Concurrency: 1, Drain: 10 * time.Second, Logger: slog.Default()}
}

// check returns the first setting of c that is missing or malformed, as
// a *eoskit.ConfigError of pkg.
func (c *Config) check(pkg string) error {
	fail := func(setting, reason string) error {
		return &eoskit.ConfigError{Package: pkg, Setting: setting, Reason: reason}
	}
	switch {
	case len(c.Brokers) == 0:
		return fail("Brokers", "at least one seed broker is required")
	case c.Group == "":
		return fail("Group", "name the consumer group")
	case len(c.Topics) == 0:
		return fail("Topics", "name at least one topic")
	case c.MaxPoll <= 0:
		return fail("MaxRecordsPerCommit", "must be positive")
	case c.Concurrency < 1:
		return fail("Concurrency", "must be at least 1")
	case c.Drain < 0:
		return fail("DrainTimeout", "must not be negative (0 rolls back at once)")
	case c.Logger == nil:
		return fail("Logger", "must not be nil")
	}
	return nil
}

// owned are the kgo options a database runner sets itself, with the
// runner option to use instead.
func owned(pkg string, extra map[string]string) map[string]string {
	m := map[string]string{
		"ConsumerGroup":     "use " + pkg + ".Group",
		"ConsumeTopics":     "use " + pkg + ".Topics",
		"ConsumeRegex":      "name the topics with " + pkg + ".Topics",
		"ConsumePartitions": "a runner consumes in its group (" + pkg + ".Group)",
		"TransactionalID":   "a runner commits in PostgreSQL, not in Kafka transactions",
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// newClient builds the group consumer: the exactly-once consumer preset,
// the user's options, then the core's own, and checks the result against
// the preset (auto-commit off, read_committed), so that a record of a
// transaction that aborted upstream never reaches the database.
func (c *Core) newClient(hooks ...kgo.Opt) (*kgo.Client, error) {
	opts := preset.ExactlyOnce.ConsumerOptions()
	if c.cfg.Concurrency > 1 {
		// A paused partition, resumed, joins the next fetch to its
		// broker only once the fetch in flight returns: with the other
		// partitions caught up, after FetchMaxWait (kgo's default 5 s).
		// The user's options come after, and may set another.
		opts = append(opts, kgo.FetchMaxWait(loop.PipelineFetchMaxWait))
	}
	opts = append(opts, c.cfg.ClientOpts...)
	if c.cfg.ConsumerProtocol {
		opts = append(opts, loop.ConsumerProtocolOpts()...)
	}
	opts = append(opts, kgo.SeedBrokers(c.cfg.Brokers...), kgo.ConsumerGroup(c.cfg.Group), kgo.ConsumeTopics(c.cfg.Topics...),
		// A poll's records are handed over (to a batch, or a
		// partition's pipeline) before a rebalance may take their
		// partitions: it waits for AllowRebalance.
		kgo.BlockRebalanceOnPoll())
	opts = append(opts, hooks...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, &eoskit.ConfigError{Package: c.pkg, Setting: "ClientOptions", Reason: err.Error(), Err: err}
	}
	if refused := preset.ExactlyOnce.CheckConsumer(cl); refused != nil {
		cl.Close()
		// The preset's refusal, as this package's: the kgo setting at
		// fault and why, under ClientOptions.
		return nil, &eoskit.ConfigError{Package: c.pkg, Setting: "ClientOptions", Semantics: preset.ExactlyOnce.String(), Reason: refused.Setting + ": " + refused.Reason}
	}
	return cl, nil
}

// New checks cfg and the user's client options, and returns the core of
// a pkg runner that commits with run.
func New(pkg string, cfg Config, run Runner) (*Core, error) {
	if err := cfg.check(pkg); err != nil {
		return nil, err
	}
	userHooks, err := loop.ReadUserOptions(preset.ExactlyOnce.ConsumerOptions(), cfg.ClientOpts, owned(pkg, run.Owned))
	if err != nil {
		return nil, &eoskit.ConfigError{Package: pkg, Setting: "ClientOptions", Reason: err.Error(), Err: err}
	}
	c := &Core{pkg: pkg, cfg: cfg, run: run, userHooks: userHooks, Obs: loop.NewObserver(pkg, cfg.Group, cfg.Metrics)}
	// The client that checks the options consumes no topic, so that it
	// never starts to join the group: a join, however brief, would
	// rebalance the group's running members and call the caller's
	// partition callbacks.
	cl, err := c.newClient(kgo.ConsumeTopics())
	if err != nil {
		return nil, err
	}
	cl.Close()
	return c, nil
}
