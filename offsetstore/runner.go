package offsetstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/consume"
	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/pgretry"
)

// Handler writes the results of one batch with tx. Every write must go
// through tx: it commits with the batch's offsets, or not at all. The batch
// holds records of one or more partitions, in offset order per partition.
// A handler may see the same records again after a failure or a rebalance;
// only the attempt that committed has any effect.
type Handler func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error

// Runner consumes topics in a group and commits each batch's results and
// its next offsets in one PostgreSQL transaction.
type Runner struct {
	pool    *pgxpool.Pool
	handler Handler
	cfg     config

	mu        sync.Mutex
	positions map[topicPartition]int64 // next offset the database holds for each owned partition; noRow if none
	topicIDs  map[string]pgtype.UUID   // the assigned topics' IDs, as of their last assignment (invalid if unknown)
	// oldRows holds, per owned partition, the topic ID of a stored row
	// left by an earlier topic of the same name: the first commit
	// replaces that row, and only that row.
	oldRows map[topicPartition]pgtype.UUID
	admin   atomic.Pointer[kadm.Client] // on Run's client, for topic IDs

	batches, records, stale, deadLetters atomic.Int64
	// core runs Run: the client, the poll loop, the pipelines, and the
	// copy of committed offsets to Kafka under MirrorToKafka.
	core *consume.Core
	// obs takes what the runner reports: its metrics and its health.
	obs *loop.Observer
	// deadLetterLog logs the records parked, at most one line a second.
	deadLetterLog *loop.DeadLetterLog
}

type topicPartition struct {
	topic     string
	partition int32
}

// noRow marks an owned partition with no stored offset yet.
const noRow = -1

// Option configures a [Runner].
type Option func(*config)

type config struct {
	// core holds the settings of the consume core: brokers, group,
	// topics, poll size, concurrency, drain, logger, metrics and client
	// options.
	core   consume.Config
	reset  kgo.Offset
	policy eoskit.ErrorPolicy
	mirror bool
	owner  string
}

// Brokers sets the seed brokers. Required.
func Brokers(addrs ...string) Option {
	return func(c *config) { c.core.Brokers = append(c.core.Brokers, addrs...) }
}

// Group sets the consumer group, which also keys the stored offsets.
// Required.
func Group(g string) Option { return func(c *config) { c.core.Group = g } }

// Topics sets the topics to consume. Required.
func Topics(t ...string) Option {
	return func(c *config) { c.core.Topics = append(c.core.Topics, t...) }
}

// ResetOffset sets where a partition with no stored offset starts. Default:
// the earliest offset. Kafka's committed offsets are never used, even when
// the database has none.
func ResetOffset(o kgo.Offset) Option { return func(c *config) { c.reset = o } }

// MaxPollRecords bounds a batch, and so a database transaction. Default: 500.
func MaxPollRecords(n int) Option { return func(c *config) { c.core.MaxPoll = n } }

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
func Concurrency(n int) Option { return func(c *config) { c.core.Concurrency = n } }

// DrainTimeout bounds how long a [Runner] drains when Run's ctx ends
// (SIGTERM, say): it stops polling, lets the batches under way finish and
// commit, and returns nil. Past the timeout their ctx is cancelled and
// they roll back (their records are read again by whoever takes the
// partitions). Default: 10s; 0 rolls back at once.
func DrainTimeout(d time.Duration) Option { return func(c *config) { c.core.Drain = d } }

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
func OnHandlerError(p eoskit.ErrorPolicy) Option { return func(c *config) { c.policy = p } }

// MirrorToKafka makes the runner copy each committed batch's offsets to the
// Kafka group after the database commit, so that lag dashboards that read
// Kafka's committed offsets keep working; under [eoskit.Stop], the records
// committed before the one Run stops on are copied before Run returns. It
// is best effort (a failure is logged), and the copies are never read
// back: the database alone decides where consumption resumes. Default: off.
func MirrorToKafka() Option { return func(c *config) { c.mirror = true } }

// Owner names this instance in the offsets table's owner column, for
// diagnostics. Default: hostname-pid.
func Owner(name string) Option { return func(c *config) { c.owner = name } }

// Logger sets the logger. Default: slog.Default(), so that an Error-level
// event is never silent unless the caller chose so.
func Logger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.core.Logger = l
		}
	}
}

// WithMetrics sets where the runner reports what it does: the same
// [eoskit.Metrics] that eos's processors report to (an eosprom.Metrics
// labels the runner's series with path "offsetstore"). A committed batch
// reports its records in and none out; aborted batches give reason
// "handler-error", "database-error" (a handler's error that was the
// database's doing too: a lost connection, a deadlock, a lock timeout) or
// "stale". Default: nowhere.
func WithMetrics(m eoskit.Metrics) Option { return func(c *config) { c.core.Metrics = m } }

// ClientOptions passes franz-go options through (TLS, SASL, timeouts,
// hooks). Options the runner sets itself are refused by NewRunner
// (kgo.ConsumerGroup, ConsumeTopics, ConsumeRegex, ConsumePartitions,
// TransactionalID, AdjustFetchOffsetsFn); partition callbacks are kept,
// run after the runner's own. They
// are checked against eos.ExactlyOnce's consumer preset: auto-commit stays
// off, and records are read with read_committed (an option that reads
// uncommitted data is refused: a record of a transaction that aborted
// upstream was never sent, and must not reach the database).
func ClientOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.core.ClientOpts = append(c.core.ClientOpts, opts...) }
}

// NewRunner returns a runner. Run [Migrate] first.
func NewRunner(pool *pgxpool.Pool, handler Handler, opts ...Option) (*Runner, error) {
	host, _ := os.Hostname()
	c := config{
		reset:  kgo.NewOffset().AtStart(),
		core:   consume.Defaults(),
		policy: eoskit.Stop(),
		owner:  host + "-" + strconv.Itoa(os.Getpid()),
	}
	for _, o := range opts {
		o(&c)
	}
	fail := func(setting, reason string) error {
		return &eoskit.ConfigError{Package: "offsetstore", Setting: setting, Reason: reason}
	}
	switch {
	case pool == nil:
		return nil, fail("pool", "must not be nil")
	case handler == nil:
		return nil, fail("handler", "must not be nil")
	case loop.CheckPolicy(c.policy, false) != nil:
		return nil, fail("OnHandlerError", loop.CheckPolicy(c.policy, false).Error())
	}
	r := &Runner{pool: pool, handler: handler, cfg: c, positions: map[topicPartition]int64{}, topicIDs: map[string]pgtype.UUID{},
		oldRows:       map[topicPartition]pgtype.UUID{},
		deadLetterLog: loop.NewDeadLetterLog(c.core.Logger.With("group", c.core.Group), "offsetstore: handler failed; parking the record in eoskit_dead_letters", loop.DeadLetterLogEvery)}
	core, err := consume.New("offsetstore", c.core, consume.Runner{
		Owned: map[string]string{"AdjustFetchOffsetsFn": "the runner positions every assigned partition at its stored offset"},
		// Every assignment seeks to the offsets stored in PostgreSQL.
		Options:       []kgo.Opt{kgo.AdjustFetchOffsetsFn(r.seekToStored)},
		Check:         r.checkSchemaRetrying,
		Start:         r.start,
		Commit:        r.handleBatch,
		Failed:        r.failed,
		Taken:         r.forget,
		CommitToKafka: c.mirror,
		CommitWhat:    "offsetstore: mirroring offsets to Kafka",
		Stopped:       r.deadLetterLog.Flush,
	})
	if err != nil {
		return nil, err
	}
	r.core, r.obs = core, core.Obs
	return r, nil
}

// seekToStored runs on every assignment, before any record of the assigned
// partitions is fetched: it replaces the offsets Kafka holds for the group
// with those stored in PostgreSQL, or the reset point where none is stored.
func (r *Runner) seekToStored(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
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
		return nil, fmt.Errorf("offsetstore: read stored offsets: %w", err)
	}
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
			} else {
				parts[p] = r.cfg.reset
				r.positions[tp] = noRow
			}
		}
	}
	r.cfg.core.Logger.Info("offsetstore: assigned; positioned at stored offsets", "offsets", loop.FormatOffsets(offsets))
	return offsets, nil
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

// Stats counts what a runner did since it was created.
type Stats struct {
	Batches       int64 // database transactions committed
	Records       int64 // records whose results were committed (dead letters included)
	DeadLetters   int64 // records parked in eoskit_dead_letters
	StaleRejected int64 // commits refused because another owner moved the offset first
}

// Health returns what the runner shows probes and dashboards: see
// [eoskit.Health]. Safe to call at any time, from any goroutine.
func (r *Runner) Health() eoskit.Health { return r.obs.Health() }

// Stats returns the runner's counts so far.
func (r *Runner) Stats() Stats {
	return Stats{Batches: r.batches.Load(), Records: r.records.Load(), DeadLetters: r.deadLetters.Load(), StaleRejected: r.stale.Load()}
}

// maxDBAttempts bounds how often a batch is retried after database errors
// before Run gives up and returns the error.
const maxDBAttempts = 10

// Run consumes until ctx is done or a record stops it under the [eoskit.Stop]
// policy (a *[eoskit.RecordError]). On ctx's end it drains ([DrainTimeout], default
// 10s): it stops polling, lets the batches under way finish and commit,
// and returns nil; only past the timeout are they rolled back, each whole
// (their records are read again by whoever takes the partitions). Lost database connections are retried with a growing pause,
// up to 10 times per batch.
func (r *Runner) Run(ctx context.Context) error { return r.core.Run(ctx) }

// checkSchemaRetrying checks the schema before Run's client joins the
// group. The check's connection may be cut like any other: retried as a
// batch is.
func (r *Runner) checkSchemaRetrying(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := r.checkSchema(ctx)
		if err == nil {
			break
		}
		if errors.Is(err, eoskit.ErrInvalidConfig) || attempt >= maxDBAttempts || !pgretry.Transient(err) {
			return err
		}
		r.cfg.core.Logger.Warn("offsetstore: reading the schema version failed; retrying", "err", err, "attempt", attempt)
		if !loop.PauseBeforeRetry(ctx, attempt) {
			return nil
		}
	}
	return nil
}

// start gives seekToStored its admin client, with Run's, before the
// first poll (seekToStored retries until it is there).
func (r *Runner) start(_ context.Context, cl *kgo.Client) error {
	r.admin.Store(kadm.NewClient(cl))
	return nil
}

// failed follows a batch that did not commit: one refused, whole or in
// part, because another owner moved its offsets first goes back to where
// the database stands (every partition it held, not only the refused
// ones, since the consumer is past all of them); any other error ends
// Run.
func (r *Runner) failed(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, err error) error {
	var stale *staleError
	if errors.As(err, &stale) {
		return r.rewind(ctx, cl, stale, recs)
	}
	return err
}

// handleBatch commits recs in one database transaction, with the records
// their handler fails on settled inside it under the error policy (see
// batchRun): parked, or stopped on once the records before them committed.
// A Retry with attempts left rolls the transaction back and runs the batch
// again after its pause, so that no lock is held through the pause.
func (r *Runner) handleBatch(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) error {
	st := newBatchState()
	for attempt := 1; ; attempt++ {
		applied, stop, err := r.commit(ctx, recs, st)
		var stale *staleError
		var retry *retryError
		var stopped *stopError
		var herr *handlerError
		switch {
		case err == nil && stop != nil:
			// The records before it committed: with MirrorToKafka, their
			// offsets go to Kafka before Run returns stop.
			return &consume.PartlyCommitted{Committed: applied, Err: stop}
		case err == nil:
			return nil
		case errors.As(err, &stale):
			return err // Run rewinds the whole polled batch
		case errors.As(err, &stopped):
			return stopped.err // nothing before it to commit
		case errors.Is(err, ErrRejectedOutsideBatch):
			return err // the handler's bug: no record is to blame
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &retry):
			if !r.retryPause(ctx, retry.halt) {
				return ctx.Err()
			}
			attempt = 0
		case errors.As(err, new(*busyError)):
			attempt = 0 // settled across attempts (failBusy): at once
		case !errors.As(err, &herr) || herr.transient:
			// Not the handler's doing (claiming the offsets rows timed
			// out, a savepoint or the commit failed), or the database
			// went away or pushed back under the handler (a deadlock, a
			// serialization failure, a lock wait that timed out): no
			// record is to blame; retry the batch.
			if attempt >= maxDBAttempts {
				return fmt.Errorf("offsetstore: batch failed %d times: %w", attempt, err)
			}
			r.cfg.core.Logger.Warn("offsetstore: database transaction failed; retrying the batch", "err", err, "attempt", attempt)
			if !loop.PauseBeforeRetry(ctx, attempt) {
				return ctx.Err()
			}
		default:
			return fmt.Errorf("offsetstore: %w", err) // not reached: batchRun settles the handler's own errors
		}
	}
}

// applyPolicy decides for a single record whose handler failed attempts
// times in this batch, with cause: nil when it is to be parked (DeadLetter,
// or a Retry's DeadLetter fallback once its attempts ran out), else what
// halts the batch's attempt: a Retry with attempts left, or the record to
// stop on.
func (r *Runner) applyPolicy(rec *kgo.Record, cause error, attempts int) *halt {
	switch d := loop.Decide(r.cfg.policy, cause, attempts); d.Fate {
	case loop.FateRetry:
		return &halt{rec: rec, cause: cause, attempts: attempts, retry: true, backoff: d.Backoff}
	case loop.FateDeadLetter:
		return nil
	}
	return &halt{rec: rec, cause: cause, attempts: attempts}
}

// commit runs one attempt at the batch in one transaction: it claims the
// batch's offsets rows (compare-and-set), runs the handler under
// savepoints, settling in the transaction the records it fails on
// (batchRun), and advances the stored offsets. It returns the records
// committed (applied or parked), and, when the attempt stopped on a
// record, the *eoskit.RecordError to stop with: the records before it committed.
// A Retry with attempts left gives a *retryError, a record to stop on
// with nothing before it a *stopError: both rolled back.
func (r *Runner) commit(ctx context.Context, recs []*kgo.Record, st *batchState) (applied []*kgo.Record, stop *eoskit.RecordError, err error) {
	start := time.Now()
	r.mu.Lock()
	// next is where each partition of the batch ends; expected is where
	// the database must still be for this owner to be the rightful one;
	// first is the batch's first offset in each.
	next := map[topicPartition]int64{}
	expected := map[topicPartition]int64{}
	first := map[topicPartition]int64{}
	ids := map[string]pgtype.UUID{}
	oldRows := map[topicPartition]pgtype.UUID{}
	fresh := recs[:0:0]
	var staleParts []topicPartition
	for _, rec := range recs {
		tp := topicPartition{rec.Topic, rec.Partition}
		pos, owned := r.positions[tp]
		if !owned {
			staleParts = append(staleParts, tp)
			continue
		}
		if pos != noRow && rec.Offset < pos {
			continue // already committed; a late copy from a fetch before a resync
		}
		if _, ok := first[tp]; !ok {
			first[tp] = rec.Offset
			ids[tp.topic] = r.topicIDs[tp.topic]
			if id, ok := r.oldRows[tp]; ok {
				oldRows[tp] = id
			}
		}
		expected[tp] = pos
		next[tp] = rec.Offset + 1
		fresh = append(fresh, rec)
	}
	r.mu.Unlock()
	if len(staleParts) > 0 {
		r.stale.Add(1)
		return nil, nil, &staleError{parts: staleParts}
	}
	if len(fresh) == 0 {
		return nil, nil, nil
	}

	// Partitions in a fixed order, so that owners claiming the same rows
	// queue on them instead of deadlocking.
	parts := make([]topicPartition, 0, len(next))
	for tp := range next {
		parts = append(parts, tp)
	}
	slices.SortFunc(parts, func(a, b topicPartition) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})

	claimed := map[topicPartition]int64{}
	var run *batchRun
	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		// Claim and check every partition's row before any side effect:
		// a stale owner is refused here, not by a failure of its
		// handler, and an owner committing the same partitions waits
		// for this transaction's end.
		clear(claimed)
		var staleParts []topicPartition
		claims := &pgx.Batch{}
		// A claim waits for another owner's transaction on the same rows,
		// but not for ever: an owner frozen mid-batch must not stall this
		// one (and the rebalance its poll holds) without a word. The
		// bound is the claim's alone: the lock timeout in force before it
		// is put back once the rows are claimed, so that the handler's
		// own lock waits are not cut short and blamed on its records.
		claims.Queue(saveLockTimeoutSQL)
		claims.Queue(claimLockTimeoutSQL)
		for _, tp := range parts {
			r.queueClaim(claims, tp, ids[tp.topic], oldRows[tp], expected[tp], first[tp], func(at int64, ok bool) {
				claimed[tp] = at
				if !ok {
					staleParts = append(staleParts, tp)
				}
			})
		}
		claims.Queue(restoreLockTimeoutSQL)
		// The handler's first savepoint, in the same round trip.
		claims.Queue(savepointSQL)
		// One round trip for them all; the server runs them in order.
		if err := tx.SendBatch(ctx, claims).Close(); err != nil {
			return err
		}
		if len(staleParts) > 0 {
			return &staleError{parts: staleParts}
		}
		run = &batchRun{r: r, tx: tx, st: st}
		applied, stop = fresh, nil
		switch err := run.run(ctx, fresh); {
		case errors.Is(err, errHalted) && run.halt.retry:
			return &retryError{halt: run.halt}
		case errors.Is(err, errHalted):
			// The records before it were applied or parked, in order:
			// they commit, and their offsets with them.
			h := run.halt
			stop = &eoskit.RecordError{Topic: h.rec.Topic, Partition: h.rec.Partition, Offset: h.rec.Offset, Attempts: h.attempts, Err: h.cause}
			applied = fresh[:slices.IndexFunc(fresh, func(rec *kgo.Record) bool { return keyOf(rec) == keyOf(h.rec) })]
			if len(applied) == 0 {
				return &stopError{err: stop}
			}
		case err != nil:
			return err
		}
		if err := run.flush(ctx); err != nil {
			return err
		}
		to := next
		if stop != nil {
			to = map[topicPartition]int64{}
			for _, rec := range applied {
				to[topicPartition{rec.Topic, rec.Partition}] = rec.Offset + 1
			}
		}
		for _, tp := range parts {
			if n, ok := to[tp]; ok {
				if err := r.advance(ctx, tx, tp, ids[tp.topic], claimed[tp], n); err != nil {
					return err
				}
				claimed[tp] = n
			}
		}
		return nil
	})
	if err != nil {
		var stale *staleError
		var herr *handlerError
		switch {
		case errors.As(err, &stale):
			r.stale.Add(1)
			r.obs.Aborted("stale", time.Since(start))
		case errors.As(err, new(*retryError)), errors.As(err, new(*stopError)), errors.Is(err, ErrRejectedOutsideBatch), errors.As(err, &herr) && !herr.transient:
			r.obs.Aborted("handler-error", time.Since(start))
		default: // a handler's error that was the database's doing too, as dedup counts it
			r.obs.Aborted("database-error", time.Since(start))
			r.obs.Failed(err)
		}
		return nil, nil, err
	}
	r.mu.Lock()
	for _, tp := range parts {
		// Where the row now stands: advanced, or, for a partition the
		// records committed do not reach (stopped on), as claimed (a row
		// created at the batch's first offset).
		if _, owned := r.positions[tp]; owned {
			r.positions[tp] = claimed[tp]
		}
		delete(r.oldRows, tp)
	}
	r.mu.Unlock()
	r.batches.Add(1)
	r.records.Add(int64(len(applied)))
	r.obs.Committed(len(applied), 0, time.Since(start))
	if n := len(run.parked); n > 0 {
		r.deadLetters.Add(int64(n))
		r.obs.DeadLettered(n)
		for _, p := range run.parked {
			r.deadLetterLog.Log(p.rec.Topic, p.rec.Partition, p.rec.Offset, p.cause, "attempts", p.attempts)
		}
	}
	return applied, stop, nil
}

// claimLockTimeout bounds how long a batch waits for another owner's lock
// on its offsets rows; past it the batch is retried like one that met a
// database error, and after maxDBAttempts Run returns the error. It bounds
// the claim only: saveLockTimeoutSQL keeps the lock timeout in force
// before it (the pool's, the role's or the server's) in a setting of the
// transaction, and restoreLockTimeoutSQL puts it back after the claim's
// statements, before the handler runs.
const claimLockTimeout = 10 * time.Second

var claimLockTimeoutSQL = fmt.Sprintf("SET LOCAL lock_timeout = %d", claimLockTimeout.Milliseconds())

const (
	saveLockTimeoutSQL    = `SELECT set_config('eoskit.lock_timeout_outside_claim', current_setting('lock_timeout'), true)`
	restoreLockTimeoutSQL = `SELECT set_config('lock_timeout', current_setting('eoskit.lock_timeout_outside_claim'), true)`
)

// queueClaim queues the claim of a partition's offsets row for this
// transaction: it locks the row and calls done with the row's offset and
// whether it is where this owner expects it, at expected, of the topic with
// this ID; or, when expected is noRow, creates the row at the batch's first
// offset (a concurrent creator waits on the unique index, then finds it
// taken), replacing only a row left by an earlier topic of the same name,
// seen at assignment (oldRow): a compare-and-set on its ID, so that an owner
// holding a stale ID never overwrites a newer row.
func (r *Runner) queueClaim(b *pgx.Batch, tp topicPartition, id, oldRow pgtype.UUID, expected, first int64, done func(at int64, ok bool)) {
	if expected == noRow {
		b.Queue(`INSERT INTO eoskit_offsets (consumer_group, topic, partition, next_offset, owner, topic_id)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (consumer_group, topic, partition) DO UPDATE
				SET next_offset = EXCLUDED.next_offset, owner = EXCLUDED.owner, topic_id = EXCLUDED.topic_id, updated_at = now()
				WHERE $7::uuid IS NOT NULL AND eoskit_offsets.topic_id = $7::uuid`,
			r.cfg.core.Group, tp.topic, tp.partition, first, r.cfg.owner, id, oldRow,
		).Exec(func(tag pgconn.CommandTag) error {
			done(first, tag.RowsAffected() == 1)
			return nil
		})
		return
	}
	b.Queue(`SELECT next_offset, topic_id FROM eoskit_offsets
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 FOR UPDATE`, r.cfg.core.Group, tp.topic, tp.partition,
	).QueryRow(func(row pgx.Row) error {
		var at int64
		var stored pgtype.UUID
		switch err := row.Scan(&at, &stored); {
		case errors.Is(err, pgx.ErrNoRows):
			done(0, false)
		case err != nil:
			return err
		default:
			sameTopic := !stored.Valid || !id.Valid || stored == id
			done(at, at == expected && sameTopic)
		}
		return nil
	})
}

// advance moves a partition's stored offset, claimed and locked by this
// transaction at from, to next, and records the topic's ID with it.
func (r *Runner) advance(ctx context.Context, tx pgx.Tx, tp topicPartition, id pgtype.UUID, from, next int64) error {
	tag, err := tx.Exec(ctx, `UPDATE eoskit_offsets SET next_offset = $4, owner = $5, updated_at = now(), topic_id = coalesce($7, topic_id)
		WHERE consumer_group = $1 AND topic = $2 AND partition = $3 AND next_offset = $6`,
		r.cfg.core.Group, tp.topic, tp.partition, next, r.cfg.owner, from, id)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("offsetstore: the claimed offsets row of %s[%d] moved under its lock", tp.topic, tp.partition)
	}
	return err
}

// rewind follows a refused batch: it moves the consumer back, for every
// partition the polled batch held and this instance still owns, to where
// the database stands (or, with no row stored, to the batch's first
// record, since nothing before it was ever applied), and drops the records
// buffered since. Whatever this instance still owns then continues from
// the other owner's commit instead of skipping records after its own
// refused ones. It runs while the poll holds the rebalance, so it does not
// race an assignment. The stored offsets are read with retries; if the
// database stays away, Run returns the error rather than go on from an
// unknown position.
func (r *Runner) rewind(ctx context.Context, cl *kgo.Client, stale *staleError, recs []*kgo.Record) error {
	r.cfg.core.Logger.Warn("offsetstore: commit refused; another owner moved these partitions' offsets first (this instance was a zombie); rolled back and rewinding every partition of the batch", "partitions", stale.parts)
	first := map[topicPartition]int64{}
	topics := map[string]bool{}
	for _, rec := range recs {
		tp := topicPartition{rec.Topic, rec.Partition}
		if _, ok := first[tp]; !ok {
			first[tp] = rec.Offset
		}
		topics[rec.Topic] = true
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	var stored map[topicPartition]int64
	var err error
	r.mu.Lock()
	ids := maps.Clone(r.topicIDs)
	owned := false
	for tp := range first {
		_, ok := r.positions[tp]
		owned = owned || ok
	}
	r.mu.Unlock()
	if !owned {
		return nil // the group took them all: their next owner reads from the database
	}
	for attempt := 1; ; attempt++ {
		if stored, err = r.load(ctx, names, ids); err == nil {
			break
		}
		if attempt >= maxDBAttempts || !loop.PauseBeforeRetry(ctx, attempt) {
			return fmt.Errorf("offsetstore: read stored offsets after a refused batch: %w", err)
		}
	}
	set := map[string]map[int32]kgo.EpochOffset{}
	r.mu.Lock()
	for tp, firstOffset := range first {
		if _, owned := r.positions[tp]; !owned {
			continue
		}
		to, ok := stored[tp]
		if ok {
			r.positions[tp] = to
		} else {
			r.positions[tp], to = noRow, firstOffset
		}
		if set[tp.topic] == nil {
			set[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		set[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: -1, Offset: to}
	}
	r.mu.Unlock()
	cl.SetOffsets(set)
	return nil
}

type staleError struct{ parts []topicPartition }

func (e *staleError) Error() string {
	return fmt.Sprintf("offsetstore: stored offsets of %v moved under this owner", e.parts)
}

// callHandler runs the handler, turning a panic into an error, so that it
// follows the error policy (the call rolls back to its savepoint; split,
// the record that panics is the one found) instead of ending the process.
func (r *Runner) callHandler(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
	return r.obs.Handle("offsetstore", func() error { return r.handler(ctx, tx, recs) })
}

// handlerError marks an error of the handler's that was the database's
// doing (pgretry.TransientOn), not the records', through pgx.BeginFunc:
// the batch is retried whole (its own failures are settled in the
// transaction, by batchRun).
type handlerError struct {
	err       error
	transient bool
}

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }
