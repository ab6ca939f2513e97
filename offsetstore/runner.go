package offsetstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/pgretry"
	"github.com/eoskit/eoskit/internal/pgtx"
)

// Handler writes the results of one batch with tx. Every write must go
// through tx: it commits with the batch's offsets, or not at all. The batch
// holds records of one or more partitions, in offset order per partition.
// A handler may see the same records again after a failure or a rebalance;
// only the attempt that committed has any effect.
// The transaction is the runner's: tx.Commit and tx.Rollback return
// [eoskit.ErrRunnerOwnsTx], and Run ends with it once the handler
// returns, nothing of the batch committed (tx.Begin opens a savepoint, as
// pgx's does). The transaction runs SET CONSTRAINTS ALL IMMEDIATE, so a
// DEFERRABLE INITIALLY DEFERRED constraint a record breaks fails the
// handler's statement, the record's fault, rather than the commit, where
// no record can be blamed. A handler that needs deferral within its call
// (circular foreign keys written in either order) sets it itself (SET
// CONSTRAINTS name DEFERRED) and must satisfy the constraint before it
// returns: a violation left for the commit is retried as the database's
// failure until Run ends.
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
		o.apply(&c)
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
		Seek:          r.seekToStored,
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
	if err := pgretry.CheckPool(ctx, "offsetstore", r.pool); err != nil {
		return err
	}
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
		case errors.Is(err, ErrRejectedOutsideBatch), errors.Is(err, eoskit.ErrRunnerOwnsTx):
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
	// An attempt whose COMMIT went unanswered is asked after first,
	// before anything else (a partition the group took since included):
	// its own commit must not pass for another owner's.
	if u := st.unconfirmed; u != nil {
		committed, err := r.confirmed(ctx, u.xid)
		if err != nil {
			return nil, nil, err // the batch is retried, and asks again
		}
		st.unconfirmed = nil
		if committed {
			r.cfg.core.Logger.Info("offsetstore: a batch's COMMIT went unanswered; the database says it committed, going on", "records", len(u.applied))
			r.settled(u, start)
			return u.applied, u.stop, nil
		}
		r.obs.Aborted("database-error", time.Since(start)) // reported now the outcome is known
	}
	r.mu.Lock()
	pl, stale := planBatch(recs, r.positions, r.oldRows, r.topicIDs)
	r.mu.Unlock()
	if stale != nil {
		r.stale.Add(1)
		return nil, nil, stale
	}
	if len(pl.fresh) == 0 {
		return nil, nil, nil
	}
	var ended *attemptEnd // set once the transaction's work is done: only COMMIT may fail then
	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		claimed, xid, err := r.claim(ctx, tx, pl)
		if err != nil {
			return err
		}
		ended, err = r.apply(ctx, tx, pl, st, claimed)
		if ended != nil {
			ended.xid = xid
		}
		return err
	})
	switch {
	case err != nil && ended != nil:
		// Committed or not, only the database knows: the next attempt
		// asks first (confirmed), and reports it then.
		st.unconfirmed = ended
		r.cfg.core.Logger.Warn("offsetstore: a batch's COMMIT went unanswered; the retry asks the database whether it committed", "err", err)
		return nil, nil, err
	case err != nil:
		reason, failed := abortReason(err)
		if reason == "stale" {
			r.stale.Add(1)
		}
		r.obs.Aborted(reason, time.Since(start))
		if failed {
			r.obs.Failed(err)
		}
		return nil, nil, err
	}
	r.settled(ended, start)
	return ended.applied, ended.stop, nil
}

// batchPlan is what a batch's attempt claims and applies: its records
// not committed yet (fresh), and per partition where the records end
// (next), where the database must still stand for this owner to be the
// rightful one (expected), the batch's first offset (first) and the
// topic ID of a stored row of an earlier topic of its name (oldRows);
// its partitions in a fixed order (parts), so that owners claiming the
// same rows queue on them instead of deadlocking.
type batchPlan struct {
	fresh                 []*kgo.Record
	next, expected, first map[topicPartition]int64
	ids                   map[string]pgtype.UUID
	oldRows               map[topicPartition]pgtype.UUID
	parts                 []topicPartition
}

// planBatch plans recs against the runner's stored positions, oldRows
// and topicIDs; a record of a partition the runner no longer owns makes
// the batch stale (a *staleError naming them).
func planBatch(recs []*kgo.Record, positions map[topicPartition]int64, oldRows map[topicPartition]pgtype.UUID, topicIDs map[string]pgtype.UUID) (batchPlan, *staleError) {
	pl := batchPlan{next: map[topicPartition]int64{}, expected: map[topicPartition]int64{}, first: map[topicPartition]int64{},
		ids: map[string]pgtype.UUID{}, oldRows: map[topicPartition]pgtype.UUID{}, fresh: recs[:0:0]}
	var staleParts []topicPartition
	for _, rec := range recs {
		tp := topicPartition{rec.Topic, rec.Partition}
		pos, owned := positions[tp]
		if !owned {
			if !slices.Contains(staleParts, tp) {
				staleParts = append(staleParts, tp)
			}
			continue
		}
		if pos != noRow && rec.Offset < pos {
			continue // already committed; a late copy from a fetch before a resync
		}
		if _, ok := pl.first[tp]; !ok {
			pl.first[tp] = rec.Offset
			pl.ids[tp.topic] = topicIDs[tp.topic]
			if id, ok := oldRows[tp]; ok {
				pl.oldRows[tp] = id
			}
			pl.parts = append(pl.parts, tp)
		}
		pl.expected[tp] = pos
		pl.next[tp] = rec.Offset + 1
		pl.fresh = append(pl.fresh, rec)
	}
	if len(staleParts) > 0 {
		return batchPlan{}, &staleError{parts: staleParts}
	}
	slices.SortFunc(pl.parts, func(a, b topicPartition) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	return pl, nil
}

// claim claims and checks every partition's row of pl in tx, before any
// side effect: a stale owner is refused here (a *staleError), not by a
// failure of its handler, and an owner committing the same partitions
// waits for this transaction's end. It returns where each row stands
// (claimed) and the transaction's ID.
func (r *Runner) claim(ctx context.Context, tx pgx.Tx, pl batchPlan) (claimed map[topicPartition]int64, xid int64, _ error) {
	claimed = map[topicPartition]int64{}
	var staleParts []topicPartition
	claims := &pgx.Batch{}
	// A claim waits for another owner's transaction on the same rows,
	// but not for ever: an owner frozen mid-batch must not stall this
	// one (and the rebalance its poll holds) without a word. The bound
	// is the claim's alone: the lock timeout in force before it is put
	// back once the rows are claimed, so that the handler's own lock
	// waits are not cut short and blamed on its records.
	pgtx.QueueClaimStart(claims)
	for _, tp := range pl.parts {
		r.queueClaim(claims, tp, pl.ids[tp.topic], pl.oldRows[tp], pl.expected[tp], pl.first[tp], func(at int64, ok bool) {
			claimed[tp] = at
			if !ok {
				staleParts = append(staleParts, tp)
			}
		})
	}
	pgtx.QueueClaimEnd(claims)
	// The transaction's ID, for the next attempt to ask whether it
	// committed should its COMMIT go unanswered (unconfirmed).
	claims.Queue(`SELECT txid_current()`).QueryRow(func(row pgx.Row) error { return row.Scan(&xid) })
	// The handler's first savepoint, in the same round trip.
	claims.Queue(savepointSQL)
	// One round trip for them all; the server runs them in order.
	if err := tx.SendBatch(ctx, claims).Close(); err != nil {
		return nil, 0, err
	}
	if len(staleParts) > 0 {
		return nil, 0, &staleError{parts: staleParts}
	}
	return claimed, xid, nil
}

// apply runs the handler over pl's records in tx (batchRun: savepoints,
// the record at fault found, parked or stopped on) and advances each
// claimed row past what it applied. It returns what the attempt will
// have committed once tx commits, or the error that rolls tx back.
func (r *Runner) apply(ctx context.Context, tx pgx.Tx, pl batchPlan, st *batchState, claimed map[topicPartition]int64) (*attemptEnd, error) {
	run := &batchRun{r: r, tx: tx, st: st, ids: pl.ids}
	applied, stop := pl.fresh, (*eoskit.RecordError)(nil)
	switch err := run.run(ctx, pl.fresh); {
	case errors.Is(err, errHalted) && run.halt.retry:
		return nil, &retryError{halt: run.halt}
	case errors.Is(err, errHalted):
		// The records before it were applied or parked, in order: they
		// commit, and their offsets with them.
		h := run.halt
		stop = &eoskit.RecordError{Topic: h.rec.Topic, Partition: h.rec.Partition, Offset: h.rec.Offset, Attempts: h.attempts, Err: h.cause}
		applied = pl.fresh[:slices.IndexFunc(pl.fresh, func(rec *kgo.Record) bool { return keyOf(rec) == keyOf(h.rec) })]
		if len(applied) == 0 {
			return nil, &stopError{err: stop}
		}
	case err != nil:
		return nil, err
	}
	if err := run.flush(ctx); err != nil {
		return nil, err
	}
	to := pl.next
	if stop != nil {
		to = map[topicPartition]int64{}
		for _, rec := range applied {
			to[topicPartition{rec.Topic, rec.Partition}] = rec.Offset + 1
		}
	}
	for _, tp := range pl.parts {
		if n, ok := to[tp]; ok {
			if err := r.advance(ctx, tx, tp, pl.ids[tp.topic], claimed[tp], n); err != nil {
				return nil, err
			}
			claimed[tp] = n
		}
	}
	return &attemptEnd{applied: applied, stop: stop, claimed: claimed, expected: pl.expected, parked: run.parked}, nil
}

// abortReason is the metrics' reason for an attempt that rolled back
// with err, and whether it is a failure Health shows (the database's).
func abortReason(err error) (reason string, failed bool) {
	var herr *handlerError
	switch {
	case errors.As(err, new(*staleError)):
		return "stale", false
	case errors.As(err, new(*retryError)), errors.As(err, new(*stopError)), errors.Is(err, ErrRejectedOutsideBatch),
		errors.Is(err, eoskit.ErrRunnerOwnsTx), errors.As(err, &herr) && !herr.transient:
		return "handler-error", false
	}
	// A handler's error that was the database's doing too, as dedup
	// counts it.
	return "database-error", true
}

// attemptEnd is what an attempt at a batch committed: the records applied
// or parked (parked), the record it stopped on, where each claimed offsets
// row stood before (expected) and then stands (claimed); xid is its
// transaction's ID.
type attemptEnd struct {
	xid               int64
	applied           []*kgo.Record
	stop              *eoskit.RecordError
	claimed, expected map[topicPartition]int64
	parked            []parkedRecord
}

// settled notes that the attempt a, begun at start, committed.
func (r *Runner) settled(a *attemptEnd, start time.Time) {
	r.mu.Lock()
	for tp, at := range a.claimed {
		// Where the row now stands: advanced, or, for a partition the
		// records committed do not reach (stopped on), as claimed (a row
		// created at the batch's first offset).
		// Only where the runner still stands where the attempt began: a
		// partition taken and assigned again since was read afresh from
		// the database, maybe further on.
		if pos, owned := r.positions[tp]; owned && pos == a.expected[tp] {
			r.positions[tp] = at
		}
		delete(r.oldRows, tp)
	}
	r.mu.Unlock()
	r.batches.Add(1)
	r.records.Add(int64(len(a.applied)))
	r.obs.Committed(len(a.applied), 0, time.Since(start))
	if n := len(a.parked); n > 0 {
		r.deadLetters.Add(int64(n))
		r.obs.DeadLettered(n)
		for _, p := range a.parked {
			r.deadLetterLog.Log(p.rec.Topic, p.rec.Partition, p.rec.Offset, p.cause, "attempts", p.attempts)
		}
	}
}

// confirmed asks the database whether the transaction xid, whose COMMIT
// went unanswered, committed. An ID too old to be known (NULL) is taken
// as not committed: the claim then finds the rows where they stand, and
// a moved row is a stale owner's refusal, as before.
func (r *Runner) confirmed(ctx context.Context, xid int64) (bool, error) {
	var status pgtype.Text
	err := r.pool.QueryRow(ctx, `SELECT txid_status($1)`, xid).Scan(&status)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "22023" {
		// "in the future": a server that lost it (a failover to a replica
		// behind). Unknown: the claim finds the rows where they stand.
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("offsetstore: ask whether a batch whose COMMIT went unanswered committed: %w", err)
	}
	switch status.String {
	case "committed":
		return true, nil
	case "in progress":
		return false, fmt.Errorf("offsetstore: the transaction of a batch whose COMMIT went unanswered is still in progress")
	}
	return false, nil
}

// callHandler runs the handler, turning a panic into an error, so that it
// follows the error policy (the call rolls back to its savepoint; split,
// the record that panics is the one found) instead of ending the process.
func (r *Runner) callHandler(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
	htx := pgtx.ForHandler(tx)
	err := r.obs.Handle("offsetstore", func() error { return r.handler(ctx, htx, recs) })
	if misused := htx.Misused("offsetstore"); misused != nil {
		return misused
	}
	return err
}

// handlerError marks an error of the handler's that was the database's
// doing (pgretry.FromHandler, or its connection closed or failing the
// rollback to the savepoint), not the records', through pgx.BeginFunc:
// the batch is retried whole (its own failures are settled in the
// transaction, by batchRun).
type handlerError struct {
	err       error
	transient bool
}

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }
