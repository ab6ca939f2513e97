package dedup

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/consume"
)

// Option configures a [Consumer]. Each option implements it, kgo's way:
// the settings every database runner shares are written once in the
// consume core (shared), the dedup ones here (own).
type Option interface{ apply(*config) }

// shared is a setting of the consume core.
type shared consume.Setting

func (s shared) apply(c *config) { s(&c.core) }

// own is a setting of dedup's own.
type own func(*config)

func (o own) apply(c *config) { o(c) }

type config struct {
	core    consume.Config
	scope   string
	id      IDFunc
	missing MissingIDPolicy
	policy  eoskit.ErrorPolicy
}

// Brokers sets the seed brokers. Required.
func Brokers(addrs ...string) Option { return shared(consume.Brokers(addrs...)) }

// Group sets the consumer group. Required.
func Group(g string) Option { return shared(consume.Group(g)) }

// Topics sets the topics to consume. Required.
func Topics(t ...string) Option { return shared(consume.Topics(t...)) }

// Scope names the dedup namespace ids are claimed in. Default: the group.
// Consumers that must not apply one message twice between them (two groups
// feeding one table, say) share a scope; consumers whose effects are
// independent use different scopes, since each must apply every message.
func Scope(s string) Option { return own(func(c *config) { c.scope = s }) }

// ID sets how a message's id is found. Default: HeaderID(IDHeader).
func ID(f IDFunc) Option { return own(func(c *config) { c.id = f }) }

// OnMissingID sets what happens to a record without an id. Default:
// RejectMissingID.
func OnMissingID(p MissingIDPolicy) Option { return own(func(c *config) { c.missing = p }) }

// MaxRecordsPerCommit bounds a batch, and so a database transaction: the
// records of one poll (of one partition, under [Concurrency] above 1).
// eos and outbox bound their transactions under the same name. Default:
// 500.
func MaxRecordsPerCommit(n int) Option { return shared(consume.MaxRecordsPerCommit(n)) }

// MaxPollRecords is [MaxRecordsPerCommit]'s earlier name.
//
// Deprecated: use MaxRecordsPerCommit.
func MaxPollRecords(n int) Option { return MaxRecordsPerCommit(n) }

// Concurrency lets a [Consumer] apply up to n partitions' batches at once.
// Each partition is then a pipeline: a poll's records of a partition are a
// batch that claims its ids and runs its handler in a database
// transaction of its own, while the consumer goes on polling the others;
// a partition holds two batches at most (the one applying and the next,
// fetched meanwhile) and is paused while it does, so a slow partition
// holds only itself and its records stay in offset order. An id that two
// batches claim at once is applied once: the second waits on the first's
// claim and then skips it. A revoked partition's batches end (at most the
// rebalance timeout) and their offsets are committed before the revoke
// returns. FetchMaxWait defaults to 100 ms then (kgo's is 5 s): a resumed
// partition joins the next fetch only once the one in flight returns;
// ClientOptions may set another. Default: 1, one transaction for the
// whole poll, before the next poll. The handler must be safe for
// concurrent use, and the pool must hold n connections. Either way the
// offsets of committed batches go to Kafka every 100 ms at most, and at
// once on a revoke and when Run returns.
func Concurrency(n int) Option { return shared(consume.Concurrency(n)) }

// DrainTimeout bounds how long a [Consumer] drains when Run's ctx ends
// (SIGTERM, say): it stops polling, lets the batches under way finish,
// commits them and their offsets, and returns nil. Past the timeout their
// ctx is cancelled and they roll back (their records are redelivered).
// Default: 10s; 0 rolls back at once.
func DrainTimeout(d time.Duration) Option { return shared(consume.DrainTimeout(d)) }

// OnHandlerError sets what happens to a record whose handler fails or
// panics: [eoskit.Stop] (the default), [eoskit.Retry] (then, with
// [eoskit.ErrorPolicy.Then], Stop or [DeadLetter]) or [DeadLetter], or
// [eoskit.Classify] to choose among them by the error. A record without a usable id ([ErrMissingID],
// [ErrIDTooLong]) is not the handler's failure: it stops the consumer
// under every policy.
//
//   - Stop: Run returns a *[eoskit.RecordError] naming the record.
//   - Retry rolls the batch back, pauses, and runs it again, until the
//     record has failed attempts times in all; then the fallback applies.
//
// The record's writes are rolled back first (the batch's database
// transaction, with its claims, or, once the batch met a failure, its
// writes since a savepoint), so nothing of the failed attempt is applied
// or claimed. NewConsumer refuses a dead letter to a topic (eos.DeadLetter)
// with a *[eoskit.ConfigError]: a consumer parks in its table.
func OnHandlerError(p eoskit.ErrorPolicy) Option { return own(func(c *config) { c.policy = p }) }

// Logger sets the logger. Default: slog.Default(), so that an Error-level
// event is never silent unless the caller chose so.
func Logger(l *slog.Logger) Option { return shared(consume.Logger(l)) }

// WithMetrics sets where the consumer reports what it does: the same
// [eoskit.Metrics] that eos's processors report to (an eosprom.Metrics
// labels the consumer's series with path "dedup"). A committed batch
// reports its records in (applied, skipped and parked) and none out;
// rolled-back batches give reason "handler-error" or "database-error".
// Default: nowhere.
func WithMetrics(m eoskit.Metrics) Option { return shared(consume.Metrics(m)) }

// ClientOptions passes franz-go options through (TLS, SASL, timeouts,
// hooks). Options the consumer sets itself are refused by NewConsumer
// (kgo.ConsumerGroup, ConsumeTopics, ConsumeRegex, ConsumePartitions,
// TransactionalID); partition callbacks are kept, run after the
// consumer's own. They are checked against eos.ExactlyOnce's consumer preset: one
// that turns auto-commit on, or reads uncommitted data (records of
// transactions that aborted upstream), is refused.
func ClientOptions(opts ...kgo.Opt) Option { return shared(consume.ClientOptions(opts...)) }
