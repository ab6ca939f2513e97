package dedup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/pgretry"
)

// Handler applies one message's side effect with tx, the transaction in
// which the consumer claimed the message's id. Every write must go through
// tx: a write through another connection is not rolled back with the claim.
type Handler func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error

// Consumer is an at-least-once Kafka consumer that applies each message's
// side effect once. For each polled batch it opens one PostgreSQL
// transaction, claims the batch's ids, calls the handler for the records
// whose ids it claimed (skipping the rest, and later copies of an id in the
// same batch), commits, and only then commits the Kafka offsets.
type Consumer struct {
	pool    *pgxpool.Pool
	store   *PostgresStore
	handler Handler
	cfg     config

	applied, skipped atomic.Int64
	running          atomic.Bool
}

// Option configures a [Consumer].
type Option func(*config)

type config struct {
	brokers    []string
	group      string
	topics     []string
	scope      string
	id         IDFunc
	missing    MissingIDPolicy
	maxPoll    int
	retry      time.Duration
	stop       bool
	logger     *slog.Logger
	clientOpts []kgo.Opt
}

// Brokers sets the seed brokers. Required.
func Brokers(addrs ...string) Option {
	return func(c *config) { c.brokers = append(c.brokers, addrs...) }
}

// Group sets the consumer group. Required.
func Group(g string) Option { return func(c *config) { c.group = g } }

// Topics sets the topics to consume. Required.
func Topics(t ...string) Option { return func(c *config) { c.topics = append(c.topics, t...) } }

// Scope names the dedup namespace ids are claimed in. Default: the group.
// Consumers that must not apply one message twice between them (two groups
// feeding one table, say) share a scope; consumers whose effects are
// independent use different scopes, since each must apply every message.
func Scope(s string) Option { return func(c *config) { c.scope = s } }

// ID sets how a message's id is found. Default: HeaderID(IDHeader).
func ID(f IDFunc) Option { return func(c *config) { c.id = f } }

// OnMissingID sets what happens to a record without an id. Default:
// RejectMissingID.
func OnMissingID(p MissingIDPolicy) Option { return func(c *config) { c.missing = p } }

// MaxPollRecords bounds a batch, and so a database transaction. Default: 500.
func MaxPollRecords(n int) Option { return func(c *config) { c.maxPoll = n } }

// RetryHandlerErrors makes a batch whose handler failed roll back, wait
// backoff, and run again, for as long as it keeps failing. Default: stop
// with a *RecordError naming the record.
func RetryHandlerErrors(backoff time.Duration) Option {
	return func(c *config) { c.retry, c.stop = backoff, false }
}

// Logger sets the logger. Default: discard.
func Logger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// ClientOptions passes franz-go options through (TLS, SASL, timeouts,
// hooks). They are checked against eos.ExactlyOnce's consumer preset: one
// that turns auto-commit on, or reads uncommitted data (records of
// transactions that aborted upstream), is refused.
func ClientOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.clientOpts = append(c.clientOpts, opts...) }
}

// NewConsumer returns a consumer that claims ids in store and applies
// handler. Run store.Migrate first.
func NewConsumer(pool *pgxpool.Pool, store *PostgresStore, handler Handler, opts ...Option) (*Consumer, error) {
	c := config{id: HeaderID(IDHeader), maxPoll: 500, stop: true, logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range opts {
		o(&c)
	}
	if c.scope == "" {
		c.scope = c.group
	}
	fail := func(setting, reason string) error { return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, setting, reason) }
	switch {
	case pool == nil:
		return nil, fail("pool", "must not be nil")
	case store == nil:
		return nil, fail("store", "must not be nil")
	case handler == nil:
		return nil, fail("handler", "must not be nil")
	case len(c.brokers) == 0:
		return nil, fail("Brokers", "at least one seed broker is required")
	case c.group == "":
		return nil, fail("Group", "name the consumer group")
	case len(c.topics) == 0:
		return nil, fail("Topics", "name at least one topic")
	case c.id == nil:
		return nil, fail("ID", "must not be nil")
	case c.maxPoll <= 0:
		return nil, fail("MaxPollRecords", "must be positive")
	case c.retry < 0:
		return nil, fail("RetryHandlerErrors", "backoff must not be negative")
	case c.missing != RejectMissingID && c.missing != TreatAsUnique:
		return nil, fail("OnMissingID", "unknown policy")
	}
	cl, err := c.newClient()
	if err != nil {
		return nil, err
	}
	cl.Close()
	return &Consumer{pool: pool, store: store, handler: handler, cfg: c}, nil
}

// newClient builds the group consumer: offsets are committed by the
// consumer after the database commit, never automatically, and it reads
// committed data only. That is eos.ExactlyOnce's consumer preset, checked
// after the user's options: a record of an aborted transaction upstream
// (an eos.Processor, Kafka Streams, Flink) was never sent, and applying it
// is an anomaly no id can deduplicate.
func (c *config) newClient() (*kgo.Client, error) {
	opts := append(eos.ExactlyOnce.ConsumerOptions(), c.clientOpts...)
	opts = append(opts, kgo.SeedBrokers(c.brokers...), kgo.ConsumerGroup(c.group), kgo.ConsumeTopics(c.topics...),
		kgo.BlockRebalanceOnPoll())
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: ClientOptions: %w", ErrInvalidConfig, err)
	}
	if err := eos.ExactlyOnce.Check(cl, eos.RoleConsumer); err != nil {
		cl.Close()
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return cl, nil
}

// Stats counts what a consumer did since it was created.
type Stats struct {
	Applied int64 // records whose side effect was applied and committed
	Skipped int64 // records skipped as copies of an id already processed
}

// Stats returns the consumer's counts so far.
func (c *Consumer) Stats() Stats {
	return Stats{Applied: c.applied.Load(), Skipped: c.skipped.Load()}
}

// Run consumes until ctx is done (then it returns nil) or a record stops
// it (a *RecordError). A batch whose database transaction fails (deadlock,
// serialization failure, lost connection) is rolled back and run again, up
// to 10 times with a growing pause, before Run returns the error.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("dedup: Consumer.Run called while already running")
	}
	defer c.running.Store(false)
	if err := c.store.check(ctx, c.pool); err != nil {
		return err
	}
	cl, err := c.cfg.newClient()
	if err != nil {
		return err
	}
	// The last poll may hold a rebalance; Close alone would wait for it.
	defer cl.CloseAllowingRebalance()

	refused := &authz.Watch{Group: c.cfg.group, Grace: authz.DefaultGrace}
	for {
		fetches, stop, err := loop.Poll(ctx, cl.PollRecords, c.cfg.maxPoll, c.cfg.logger, refused)
		if stop {
			return nil
		}
		if err != nil {
			return fmt.Errorf("dedup: %w", err)
		}
		recs := fetches.Records()
		if len(recs) == 0 {
			cl.AllowRebalance()
			continue
		}
		for attempt := 1; ; attempt++ {
			applied, skipped, err := c.apply(ctx, recs)
			if err == nil {
				c.applied.Add(int64(applied))
				c.skipped.Add(int64(skipped))
				break
			}
			if ctx.Err() != nil {
				return nil // the batch rolled back; it is read again
			}
			var rerr *RecordError
			switch {
			case errors.As(err, &rerr) && (c.cfg.stop || errors.Is(err, ErrMissingID) || errors.Is(err, ErrIDTooLong)):
				return err
			case errors.As(err, &rerr):
				c.cfg.logger.Warn("dedup: handler failed; retrying the batch", "err", err, "backoff", c.cfg.retry)
				if !loop.Sleep(ctx, c.cfg.retry) {
					return nil
				}
			case attempt >= maxDBAttempts:
				return fmt.Errorf("dedup: batch failed %d times: %w", attempt, err)
			default:
				// Deadlocks, serialization failures and a restarting
				// server all pass; a missing table does not, and ends
				// here after maxDBAttempts.
				c.cfg.logger.Warn("dedup: database transaction failed; retrying the batch", "err", err, "attempt", attempt)
				if !loop.Sleep(ctx, loop.Backoff(attempt, 100*time.Millisecond)) {
					return nil
				}
			}
		}
		// The database has committed; a crash before this commit only
		// redelivers records whose ids are claimed, and they are skipped.
		if err := cl.CommitRecords(ctx, recs...); err != nil && ctx.Err() == nil {
			c.cfg.logger.Warn("dedup: offset commit failed; the batch will be redelivered and skipped", "err", err)
		}
		cl.AllowRebalance()
	}
}

// callHandler runs the handler, turning a panic into an error naming
// nothing but the panic, so that the batch rolls back and the record is
// stopped on (or retried) like one whose handler failed, instead of the
// process ending.
func (c *Consumer) callHandler(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	return loop.Recover("dedup", func() error { return c.handler(ctx, tx, r) })
}

// maxDBAttempts bounds how often a batch is retried after database errors
// (not handler errors) before Run gives up.
const maxDBAttempts = 10

// apply runs one batch in one database transaction.
func (c *Consumer) apply(ctx context.Context, recs []*kgo.Record) (applied, skipped int, err error) {
	ids := make([]string, len(recs))
	hasID := make([]bool, len(recs))
	var claim []string
	for i, r := range recs {
		ids[i], hasID[i] = c.cfg.id(r)
		if !hasID[i] {
			if c.cfg.missing == RejectMissingID {
				return 0, 0, &RecordError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Err: ErrMissingID}
			}
			continue
		}
		if len(ids[i]) > MaxIDLength {
			return 0, 0, &RecordError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				Err: fmt.Errorf("%w (%d bytes)", ErrIDTooLong, len(ids[i]))}
		}
		claim = append(claim, ids[i])
	}
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		applied, skipped = 0, 0
		claimed, err := c.store.ClaimBatch(ctx, tx, c.cfg.scope, claim)
		if err != nil {
			return err
		}
		for i, r := range recs {
			if hasID[i] {
				if !claimed[ids[i]] {
					skipped++
					continue
				}
				delete(claimed, ids[i]) // a later copy in this batch is a duplicate
			}
			if err := c.callHandler(ctx, tx, r); err != nil {
				if pgretry.Transient(ctx, c.pool, err) {
					return err // the database went away: retry the batch
				}
				return &RecordError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Err: err}
			}
			applied++
		}
		return nil
	})
	return applied, skipped, err
}
