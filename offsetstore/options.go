package offsetstore

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/consume"
)

// Option configures a [Runner]. Each option implements it, kgo's way:
// the settings every database runner shares are written once in the
// consume core (shared), the offsetstore ones here (own).
type Option interface{ apply(*config) }

// shared is a setting of the consume core.
type shared consume.Setting

func (s shared) apply(c *config) { s(&c.core) }

// own is a setting of offsetstore's own.
type own func(*config)

func (o own) apply(c *config) { o(c) }

type config struct {
	core   consume.Config
	reset  kgo.Offset
	policy eoskit.ErrorPolicy
	mirror bool
	owner  string
}

// Brokers sets the seed brokers. Required.
func Brokers(addrs ...string) Option { return shared(consume.Brokers(addrs...)) }

// Group sets the consumer group, which also keys the stored offsets.
// Required.
func Group(g string) Option { return shared(consume.Group(g)) }

// Topics sets the topics to consume. Required.
func Topics(t ...string) Option { return shared(consume.Topics(t...)) }

// ResetOffset sets where a partition with no stored offset starts. Default:
// the earliest offset. Kafka's committed offsets are never used, even when
// the database has none.
func ResetOffset(o kgo.Offset) Option { return own(func(c *config) { c.reset = o }) }

// MaxRecordsPerCommit bounds a batch, and so a database transaction: the
// records of one poll (of one partition, under [Concurrency] above 1).
// eos and outbox bound their transactions under the same name. Default:
// 500.
func MaxRecordsPerCommit(n int) Option { return shared(consume.MaxRecordsPerCommit(n)) }

// MaxPollRecords is [MaxRecordsPerCommit]'s earlier name.
//
// Deprecated: use MaxRecordsPerCommit.
func MaxPollRecords(n int) Option { return MaxRecordsPerCommit(n) }

// Concurrency lets a [Runner] commit up to n partitions' batches at once.
// Each partition is then a pipeline: a poll's records of a partition are a
// batch that runs its handler and stores its offsets in a database
// transaction of its own, while the runner goes on polling the others; a
// partition holds two batches at most (the one committing and the next,
// fetched meanwhile) and is paused while it does, so a slow partition
// holds only itself, its records stay in offset order, and each batch is
// still all or nothing with its offsets. A revoked partition's batches
// end before the revoke returns (at most the rebalance timeout: past it
// the partition goes to its next owner, and the compare-and-set on the
// stored offset refuses whichever commits second). FetchMaxWait defaults
// to 100 ms then (kgo's is 5 s): a resumed partition joins the next fetch
// only once the one in flight returns; ClientOptions may set another.
// Default: 1, one transaction for the whole poll, before the next poll.
// The handler must be safe for concurrent use, and the pool must hold n
// connections. A record that stops the runner does not stop the other
// partitions' batches under way: they commit or fail first.
func Concurrency(n int) Option { return shared(consume.Concurrency(n)) }

// DrainTimeout bounds how long a [Runner] drains when Run's ctx ends
// (SIGTERM, say): it stops polling, lets the batches under way finish and
// commit, and returns nil. Past the timeout their ctx is cancelled and
// they roll back (their records are read again by whoever takes the
// partitions). Default: 10s; 0 rolls back at once.
func DrainTimeout(d time.Duration) Option { return shared(consume.DrainTimeout(d)) }

// OnHandlerError sets what happens to a record whose handler fails or
// panics: [eoskit.Stop] (the default), [eoskit.Retry] (then, with
// [eoskit.ErrorPolicy.Then], Stop or [DeadLetter]) or [DeadLetter], or
// [eoskit.Classify] to choose among them by the error. The record is the
// one the handler names with [Reject], or, when it names none, the one
// found by splitting the batch in halves; either way inside the batch's
// database transaction, each handler call under a savepoint that its
// failure rolls back to (see the package documentation).
//
//   - Stop: Run returns a *[eoskit.RecordError] naming the record, once
//     the records before it in its batch committed with their offsets.
//   - Retry rolls the batch's transaction back whole (no lock is held
//     through the pause), pauses, and runs the batch again, until the
//     record has failed attempts times in all; then the fallback applies
//     inside the transaction: a DeadLetter fallback parks the record there
//     and the batch goes on. A record of the batch already parked is
//     parked again without its handler when the batch runs again.
//
// NewRunner refuses a dead letter to a topic (eos.DeadLetter) with a
// *[eoskit.ConfigError]: a runner parks in its table.
func OnHandlerError(p eoskit.ErrorPolicy) Option { return own(func(c *config) { c.policy = p }) }

// MirrorToKafka makes the runner copy each committed batch's offsets to the
// Kafka group after the database commit, and the stored offsets on every
// assignment (so that a copy a crash lost is made good with no further
// input), so that lag dashboards that read Kafka's committed offsets keep
// working; under [eoskit.Stop], the records
// committed before the one Run stops on are copied before Run returns. It
// is best effort (a failure is logged), and the copies are never read
// back: the database alone decides where consumption resumes. Default: off.
func MirrorToKafka() Option { return own(func(c *config) { c.mirror = true }) }

// Owner names this instance in the offsets table's owner column, for
// diagnostics. Default: hostname-pid.
func Owner(name string) Option { return own(func(c *config) { c.owner = name }) }

// Logger sets the logger. Default: slog.Default(), so that an Error-level
// event is never silent unless the caller chose so.
func Logger(l *slog.Logger) Option { return shared(consume.Logger(l)) }

// WithMetrics sets where the runner reports what it does: the same
// [eoskit.Metrics] that eos's processors report to (an eosprom.Metrics
// labels the runner's series with path "offsetstore"). A committed batch
// reports its records in and none out; aborted batches give reason
// "handler-error", "database-error" (a handler's error that was the
// database's doing too: a lost connection, a deadlock, a lock timeout) or
// "stale". Default: nowhere.
func WithMetrics(m eoskit.Metrics) Option { return shared(consume.Metrics(m)) }

// ClientOptions passes franz-go options through (TLS, SASL, timeouts,
// hooks). Options the runner sets itself are refused by NewRunner
// (kgo.ConsumerGroup, ConsumeTopics, ConsumeRegex, ConsumePartitions,
// TransactionalID, AdjustFetchOffsetsFn); partition callbacks are kept,
// run after the runner's own. They
// are checked against eos.ExactlyOnce's consumer preset: auto-commit stays
// off, and records are read with read_committed (an option that reads
// uncommitted data is refused: a record of a transaction that aborted
// upstream was never sent, and must not reach the database).
func ClientOptions(opts ...kgo.Opt) Option { return shared(consume.ClientOptions(opts...)) }
