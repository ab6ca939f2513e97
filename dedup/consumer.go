package dedup

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/consume"
	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/pgretry"
	"github.com/eoskit/eoskit/internal/pgtx"
)

// Handler applies one message's side effect with tx, the transaction in
// which the consumer claimed the message's id. Every write must go through
// tx: a write through another connection is not rolled back with the claim.
// The transaction is the consumer's: tx.Commit and tx.Rollback return
// [eoskit.ErrRunnerOwnsTx], and Run ends with it once the handler
// returns, nothing of the batch committed (tx.Begin opens a savepoint, as
// pgx's does). The transaction runs SET CONSTRAINTS ALL IMMEDIATE, so a
// DEFERRABLE INITIALLY DEFERRED constraint a record breaks fails the
// handler's statement, the record's fault, rather than the commit, where
// no record can be blamed. A handler that needs deferral within its call
// (circular foreign keys written in either order) sets it itself (SET
// CONSTRAINTS name DEFERRED) and must satisfy the constraint before it
// returns: a violation left for the commit is retried as the database's
// failure until Run ends. The claim waits at most 10 s at a time for
// another transaction's claim of the same id (a consumer of another
// partition, or one frozen mid-batch), then the batch waits again, with a
// warning each time.
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

	applied, skipped, deadLetters atomic.Int64
	// core runs Run: the client, the poll loop, the pipelines, and the
	// offset commits to Kafka after the database's.
	core *consume.Core
	// obs takes what the consumer reports: its metrics and its health.
	obs *loop.Observer
	// deadLetterLog logs the records parked, at most one line a second.
	deadLetterLog *loop.DeadLetterLog
}

// NewConsumer returns a consumer that claims ids in store and applies
// handler. Run store.Migrate first.
func NewConsumer(pool *pgxpool.Pool, store *PostgresStore, handler Handler, opts ...Option) (*Consumer, error) {
	c := config{id: HeaderID(IDHeader), core: consume.Defaults(), policy: eoskit.Stop()}
	for _, o := range opts {
		o.apply(&c)
	}
	if c.scope == "" {
		c.scope = c.core.Group
	}
	fail := func(setting, reason string) error {
		return &eoskit.ConfigError{Package: "dedup", Setting: setting, Reason: reason}
	}
	switch {
	case pool == nil:
		return nil, fail("pool", "must not be nil")
	case store == nil:
		return nil, fail("store", "must not be nil")
	case handler == nil:
		return nil, fail("handler", "must not be nil")
	case c.id == nil:
		return nil, fail("ID", "must not be nil")
	case loop.CheckPolicy(c.policy, false) != nil:
		return nil, fail("OnHandlerError", loop.CheckPolicy(c.policy, false).Error())
	case c.missing != RejectMissingID && c.missing != TreatAsUnique:
		return nil, fail("OnMissingID", "unknown policy")
	}
	dc := &Consumer{pool: pool, store: store, handler: handler, cfg: c,
		deadLetterLog: loop.NewDeadLetterLog(c.core.Logger.With("group", c.core.Group), "dedup: handler failed; parking the record in eoskit_dead_letters", loop.DeadLetterLogEvery)}
	// The offsets go to Kafka after the database commit, never
	// automatically: a crash between the two only redelivers records
	// whose ids are claimed, and they are skipped.
	core, err := consume.New("dedup", c.core, consume.Runner{
		Check:         dc.check,
		Commit:        func(ctx context.Context, _ *kgo.Client, recs []*kgo.Record) error { return dc.applyBatch(ctx, recs) },
		CommitToKafka: true,
		CommitWhat:    "dedup: offset commit",
		Stopped:       dc.deadLetterLog.Flush,
	})
	if err != nil {
		return nil, err
	}
	dc.core, dc.obs = core, core.Obs
	return dc, nil
}

// Stats counts what a consumer did since it was created.
type Stats struct {
	Applied int64 // records whose side effect was applied and committed
	Skipped int64 // records skipped as copies of an id already processed
	// DeadLetters counts records parked in eoskit_dead_letters under the
	// DeadLetter policy (or a Retry's DeadLetter fallback).
	DeadLetters int64
}

// Health returns what the consumer shows probes and dashboards: see
// [eoskit.Health]. Safe to call at any time, from any goroutine.
func (c *Consumer) Health() eoskit.Health { return c.obs.Health() }

// Stats returns the consumer's counts so far.
func (c *Consumer) Stats() Stats {
	return Stats{Applied: c.applied.Load(), Skipped: c.skipped.Load(), DeadLetters: c.deadLetters.Load()}
}

// Run consumes until ctx is done (then it returns nil) or a record stops
// it (a *[eoskit.RecordError]). A batch whose database transaction fails (deadlock,
// serialization failure, lost connection) is rolled back and run again, up
// to 10 times with a growing pause, before Run returns the error.
func (c *Consumer) Run(ctx context.Context) error { return c.core.Run(ctx) }

// check checks the store and the dead-letter table before Run's client
// joins the group.
func (c *Consumer) check(ctx context.Context) error {
	if err := pgretry.CheckPool(ctx, "dedup", c.pool); err != nil {
		return err
	}
	if err := c.store.check(ctx, c.pool); err != nil {
		return err
	}
	if c.cfg.policy.DeadLetters() {
		switch ok, err := deadletter.Exists(ctx, c.pool); {
		case err != nil:
			return fmt.Errorf("dedup: %w", err)
		case !ok:
			return &eoskit.ConfigError{Package: "dedup", Setting: "OnHandlerError", Reason: "DeadLetter parks records in eoskit_dead_letters, which does not exist or lacks the columns of this eoskit: run the store's Migrate"}
		}
	}
	return nil
}

// applyBatch applies recs in one database transaction, retrying it after
// database errors and under the error policy. It returns nil once it
// committed, ctx's error when ctx ended, or the error Run returns.
//
// A batch runs first as one plain transaction. The first handler failure
// rolls it back; from then on the batch runs with savepoints (apply), in
// which a record to park is settled without leaving the transaction: k
// bad records cost two runs of the batch, not k+1.
func (c *Consumer) applyBatch(ctx context.Context, recs []*kgo.Record) error {
	// failures counts, per record, its handler's failures in this batch;
	// poisoned holds the records to park instead of handling.
	st := &batchState{failures: map[*kgo.Record]int{}, poisoned: map[*kgo.Record]error{}}
	for attempt := 1; ; attempt++ {
		start := time.Now()
		n, err := c.apply(ctx, recs, st)
		if err == nil {
			c.applied.Add(int64(n.applied))
			c.skipped.Add(int64(n.skipped))
			c.deadLetters.Add(int64(n.parked))
			c.obs.Committed(len(recs), 0, time.Since(start))
			c.obs.DeadLettered(n.parked)
			return nil
		}
		switch {
		case errors.As(err, new(*handlerError)):
			c.obs.Aborted("handler-error", time.Since(start))
		case errors.As(err, new(*eoskit.RecordError)):
			c.obs.Aborted("record-error", time.Since(start))
		default:
			c.obs.Aborted("database-error", time.Since(start))
			c.obs.Failed(err)
		}
		if ctx.Err() != nil {
			return ctx.Err() // the batch rolled back; it is read again
		}
		var herr *handlerError
		switch {
		case errors.As(err, &herr):
			st.failures[herr.rec]++
			st.careful = true
			if !c.afterFailure(ctx, herr, st.failures[herr.rec], st.poisoned) {
				return herr.recordError(st.failures[herr.rec])
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			attempt = 0
		case errors.As(err, new(*eoskit.RecordError)):
			return err // no usable id: no policy applies
		case errors.Is(err, eoskit.ErrRunnerOwnsTx):
			return err // the handler's bug: no record is to blame
		case errors.As(err, new(*claimWait)):
			// Another transaction holds a claim of one of the batch's
			// ids: a consumer of another partition with the same id
			// (legitimately slow), or a frozen one. Not counted against
			// maxDBAttempts; said at every wait.
			c.cfg.core.Logger.Warn("dedup: another transaction holds a claim of one of the batch's ids; waiting for it", "err", err)
			attempt = 0
			if !loop.PauseBeforeRetry(ctx, 1) {
				return ctx.Err()
			}
		case attempt >= maxDBAttempts:
			return fmt.Errorf("dedup: batch failed %d times: %w", attempt, err)
		default:
			// Deadlocks, serialization failures and a restarting server
			// all pass; a missing table does not, and ends here after
			// maxDBAttempts.
			c.cfg.core.Logger.Warn("dedup: database transaction failed; retrying the batch", "err", err, "attempt", attempt)
			if !loop.PauseBeforeRetry(ctx, attempt) {
				return ctx.Err()
			}
		}
	}
}

// afterFailure applies the error policy to the record whose handler failed
// for the attempts-th time in this batch, after the batch rolled back: it
// pauses before a Retry, or poisons the record so that the batch runs
// again parking it, and reports true; or it reports false, and Run stops
// with a *[eoskit.RecordError].
func (c *Consumer) afterFailure(ctx context.Context, herr *handlerError, attempts int, poisoned map[*kgo.Record]error) bool {
	r := herr.rec
	d := loop.Decide(c.cfg.policy, herr.err, attempts)
	switch d.Fate {
	case loop.FateRetry:
		c.cfg.core.Logger.Warn("dedup: handler failed; retrying the batch", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset,
			"err", loop.ErrorText(herr.err), "attempt", attempts, "backoff", d.Backoff)
		loop.Sleep(ctx, d.Backoff)
		return true
	case loop.FateStop:
		return false
	}
	c.deadLetterLog.Log(r.Topic, r.Partition, r.Offset, herr.err, "attempts", attempts)
	poisoned[r] = herr.err
	return true
}

// handlerError is a record whose handler failed, inside apply.
type handlerError struct {
	rec *kgo.Record
	err error
}

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

func (e *handlerError) recordError(attempts int) *eoskit.RecordError {
	return &eoskit.RecordError{Topic: e.rec.Topic, Partition: e.rec.Partition, Offset: e.rec.Offset, Attempts: attempts, Err: e.err}
}

// counts is what one batch did.
type counts struct{ applied, skipped, parked int }

// callHandler runs the handler, turning a panic into an error naming
// nothing but the panic, so that the record's writes roll back (the
// batch, or its chunk to the savepoint) and the record is stopped on,
// retried or parked like one whose handler failed, instead of the process
// ending.
func (c *Consumer) callHandler(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	htx := pgtx.ForHandler(tx)
	err := c.obs.Handle("dedup", func() error { return c.handler(ctx, htx, r) })
	if misused := htx.Misused("dedup"); misused != nil {
		return misused
	}
	return err
}

// maxDBAttempts bounds how often a batch is retried after database errors
// (not handler errors) before Run gives up.
const maxDBAttempts = 10

// apply runs one batch in one database transaction, parking the poisoned
// records (their ids claimed) instead of handling them. Once the batch is
// careful (a handler failed in it before), it runs under savepoints, one
// per chunk of handler calls (chunkSize): a record whose handler fails and
// is to be parked now (parksNow) rolls back to the savepoint, is poisoned,
// and its chunk runs again from the savepoint, parking it; any other
// failure ends the transaction with a *handlerError, as in a plain run.
func (c *Consumer) apply(ctx context.Context, recs []*kgo.Record, st *batchState) (n counts, err error) {
	ids := make([]string, len(recs))
	hasID := make([]bool, len(recs))
	var claim []string
	for i, r := range recs {
		ids[i], hasID[i] = c.cfg.id(r)
		if !hasID[i] {
			if c.cfg.missing == RejectMissingID {
				return n, &eoskit.RecordError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Err: ErrMissingID}
			}
			continue
		}
		if len(ids[i]) > MaxIDLength {
			return n, &eoskit.RecordError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				Err: fmt.Errorf("%w (%d bytes)", ErrIDTooLong, len(ids[i]))}
		}
		claim = append(claim, ids[i])
	}
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		n = counts{}
		// The claim, in one round trip with what opens the transaction
		// (pgtx): a claim waits at most pgtx.ClaimLockTimeout for a
		// zombie's uncommitted claim of the same id, and a deferred
		// constraint a handler breaks fails in its own statement.
		b := &pgx.Batch{}
		pgtx.QueueClaimStart(b)
		claimed, err := c.store.queueClaimBatch(b, c.cfg.scope, claim)
		if err != nil {
			return err
		}
		pgtx.QueueClaimEnd(b)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "55P03" {
				return &claimWait{err}
			}
			return fmt.Errorf("dedup: claim %d ids in %s: %w", len(claim), c.cfg.scope, err)
		}
		// Which records run: those whose ids this transaction claimed,
		// the first copy of each in the batch (a later one is a
		// duplicate), and those without an id. Decided once, so that a
		// chunk run again from its savepoint decides alike.
		run := make([]bool, len(recs))
		for i := range recs {
			if !hasID[i] {
				run[i] = true
			} else if claimed[ids[i]] {
				run[i] = true
				delete(claimed, ids[i])
			}
		}
		chunk := chunkSize(len(recs))
		// The savepoint's chunk: from record from, with the counts as
		// they were there, and calls handler calls in it so far; a chunk
		// ends after chunk calls, or after a record settled in it.
		from, at, calls, until := 0, n, 0, -1
		if st.careful {
			if _, err := tx.Exec(ctx, savepointSQL); err != nil {
				return err
			}
		}
		for i := 0; i < len(recs); i++ {
			if st.careful && i > from && (calls >= chunk || i == until) {
				if _, err := tx.Exec(ctx, nextSavepointSQL); err != nil {
					return err
				}
				from, at, calls = i, n, 0
			}
			r := recs[i]
			if !run[i] {
				n.skipped++
				continue
			}
			if cause, ok := st.poisoned[r]; ok {
				// With the id it claimed: a replay releases it.
				var held *deadletter.Claim
				if hasID[i] {
					held = &deadletter.Claim{Table: c.store.name, Scope: c.cfg.scope, ID: []byte(ids[i])}
				}
				if err := deadletter.Park(ctx, tx, "dedup", c.cfg.core.Group, r, c.core.TopicID(r.Topic), cause, held); err != nil {
					return err
				}
				n.parked++
				continue
			}
			calls++
			err := c.callHandler(ctx, tx, r)
			if err == nil {
				n.applied++
				continue
			}
			if errors.Is(err, eoskit.ErrRunnerOwnsTx) {
				return err // the handler's bug: Run ends, the batch rolled back
			}
			// Told from the error and this transaction's own
			// connection: with a pool of Concurrency's size, another
			// connection may never come free.
			if pgretry.FromHandler(err) || tx.Conn().IsClosed() {
				return err // the database went away or pushed back: retry the batch
			}
			attempts := st.failures[r] + 1
			// Rows the handler left open keep the connection busy:
			// no rollback to the savepoint can follow, and the record
			// is settled as outside the savepoints (the batch rolls
			// back, and its next run parks it).
			if !st.careful || !c.parksNow(err, attempts) || tx.Conn().PgConn().IsBusy() {
				if pgretry.TransientOn(ctx, tx.Conn(), err) {
					return err // the connection went silent: the database's doing
				}
				return &handlerError{rec: r, err: err}
			}
			// Parked in this transaction: its writes and its chunk's
			// roll back to the savepoint, and the chunk runs again,
			// parking it. The rollback is also what tells the
			// record's failure from the database's (as TransientOn's
			// ping would, a round trip earlier): a connection closed
			// or silent fails it, and the batch is retried whole.
			rctx, cancel := context.WithTimeout(ctx, rollbackTimeout)
			_, rerr := tx.Exec(rctx, rollbackSavepointSQL)
			cancel()
			if rerr != nil {
				return fmt.Errorf("dedup: %w (then the rollback to its savepoint failed: %w)", err, rerr)
			}
			st.failures[r] = attempts
			st.poisoned[r] = err
			c.deadLetterLog.Log(r.Topic, r.Partition, r.Offset, err, "attempts", attempts)
			n, calls, until = at, 0, i+1
			i = from - 1
		}
		return nil
	})
	return n, err
}

// claimWait is a claim that waited pgtx.ClaimLockTimeout for another
// transaction's claim of one of the batch's ids.
type claimWait struct{ err error }

func (e *claimWait) Error() string {
	return fmt.Sprintf("dedup: the claim waited %s for another transaction's claim: %v", pgtx.ClaimLockTimeout, e.err)
}
func (e *claimWait) Unwrap() error { return e.err }
