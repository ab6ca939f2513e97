package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
)

// endTimeout bounds the abort eos sends on its own after the caller's
// context is already done: the abort must still reach the broker, or the
// transaction stays open until the transaction timeout and stalls
// read_committed readers.
const endTimeout = 30 * time.Second

// TransactionalProducer writes records in Kafka transactions: all records of
// one [TransactionalProducer.Transact] call, to any topics and partitions,
// become visible to read_committed readers together, or not at all.
//
// Only one transaction is open at a time; concurrent Transact calls wait
// their turn. A TransactionalProducer is fenced, and returns [ErrFenced]
// forever after, once another producer registers the same transactional id.
type TransactionalProducer struct {
	cfg *config // to make a new client after a timed-out transaction
	// cl is replaced (under mu) after a transaction timed out; Client
	// reads it without waiting for a transaction to end.
	cl     atomic.Pointer[kgo.Client]
	txnID  string
	logger *slog.Logger

	mu    sync.Mutex // one transaction at a time; guards final and unaborted
	final error      // ErrFenced, ErrClosed or a refused transactional id, once the producer is done for good
	// unaborted is set while the last transaction's abort has not gone
	// through (its coordinator unreachable past the abort's deadline):
	// franz-go is still in that transaction, and the next Transact (or
	// Close) ends it before it begins another. open names that
	// transaction (its producer id and epoch, and when it began), so that
	// an abort refused for its epoch is told apart from fencing (ended).
	unaborted bool
	open      openTxn
}

// openTxn is the transaction under way, as ended needs it.
type openTxn struct {
	pid   int64
	epoch int16
	start time.Time
}

// NewTransactionalProducer returns a transactional producer. It accepts
// [Brokers] and [TransactionalID] (both required), [Logger] and
// [ClientOptions] (kgo.TransactionTimeout is the one most worth setting:
// default 40s, the longest a Transact call may take).
func NewTransactionalProducer(opts ...TransactionalOption) (*TransactionalProducer, error) {
	c := newConfig(opts)
	if err := c.requireBrokers(); err != nil {
		return nil, err
	}
	if c.txnID == "" {
		return nil, &eoskit.ConfigError{Package: "eos", Setting: "TransactionalID", Semantics: checkedAgainst(ExactlyOnce), Reason: "a transactional producer needs a stable transactional id (see StableTransactionalID)"}
	}
	c.semantics = ExactlyOnce
	cl, err := newClient(c, RoleProducer)
	if err != nil {
		return nil, err
	}
	p := &TransactionalProducer{cfg: c, txnID: c.txnID, logger: c.logger.With("transactional_id", c.txnID)}
	p.cl.Store(cl)
	return p, nil
}

// Tx is an open transaction, valid only inside the function given to
// [TransactionalProducer.Transact].
type Tx struct {
	ctx context.Context
	cl  *kgo.Client

	mu       sync.Mutex
	firstErr error
	produced int
	promises promises
}

// Produce adds r to the transaction without waiting for its
// acknowledgement; Transact waits for all of them before it commits, and
// aborts if any failed. Safe for concurrent use within the function.
func (tx *Tx) Produce(r *kgo.Record) {
	tx.mu.Lock()
	tx.produced++
	tx.mu.Unlock()
	tx.promises.add()
	tx.cl.Produce(tx.ctx, r, func(r *kgo.Record, err error) {
		defer tx.promises.done()
		if err == nil {
			return
		}
		tx.mu.Lock()
		defer tx.mu.Unlock()
		if tx.firstErr == nil {
			tx.firstErr = produceError(r, err)
		}
	})
}

// ProduceSync adds rs to the transaction and waits for their
// acknowledgements, returning the first failure, a *ProduceError. A failure
// dooms the transaction whatever the function returns.
func (tx *Tx) ProduceSync(rs ...*kgo.Record) error {
	for _, r := range rs {
		tx.Produce(r)
	}
	if err := tx.promises.settle(tx.ctx, tx.cl.Flush); err != nil {
		return err
	}
	return tx.err()
}

func (tx *Tx) err() error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	return tx.firstErr
}

// Transact runs fn in a transaction and commits it only if fn returned nil,
// ctx is not done, and every record fn produced was acknowledged. Otherwise
// it aborts, and returns an error wrapping [ErrAborted] and the cause (fn's
// error, the first *ProduceError, or ctx's error). If fn panics, Transact
// aborts and re-panics.
//
// Other outcomes: [ErrFenced] (final; the producer is closed);
// [ErrTransactionTimedOut] wrapped with ErrAborted when fn outlived the
// transaction timeout and the broker aborted the transaction, nobody else
// owning the id (the producer stays usable: retry with less work or a
// longer kgo.TransactionTimeout); an
// *[eoskit.AuthorizationError] wrapped with ErrAborted when the broker refused an
// ACL (final too when it is the transactional id's: make a new producer
// once it is granted); and
// [ErrOutcomeUnknown] when the commit was sent but not confirmed; eos then
// retries the end as an abort, which bumps the producer epoch so that the
// transaction can not be extended, and the producer stays usable. Whether
// the records became visible must then be found out by reading them back.
//
// ctx governs producing and committing. The abort after a failure uses its
// own 30-second deadline, so that a cancelled ctx still ends the transaction
// at the broker.
func (p *TransactionalProducer) Transact(ctx context.Context, fn func(tx *Tx) error) (err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.final != nil {
		return p.final
	}
	if p.unaborted {
		if err := p.abort(ctx); err != nil {
			return fmt.Errorf("%w: nothing began: the previous transaction's abort has not gone through yet: %w", ErrAborted, err)
		}
		if p.final != nil {
			return p.final // fenced while retrying the abort
		}
	}
	cl := p.client()
	// The id and epoch name this transaction to its coordinator, which
	// tells a timeout abort from fencing (see ended). Read before Begin,
	// so that a failure leaves no transaction open; the first call
	// registers the id, as the first produce would.
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		if refused := p.refused(err); refused != nil {
			return refused
		}
		if isFenced(err) {
			return p.classify("producer id", err)
		}
		return fmt.Errorf("%w: nothing began: producer id: %w", ErrAborted, err)
	}
	if err := cl.BeginTransaction(); err != nil {
		return p.classify("begin transaction", err)
	}
	start := time.Now()
	p.open = openTxn{pid: pid, epoch: epoch, start: start}
	ended := func(op string, err error) error { return p.ended(ctx, op, err, start, pid, epoch) }
	tx := &Tx{ctx: ctx, cl: cl}

	committed := false
	defer func() {
		if committed {
			return
		}
		// Reached on every path that did not commit, panics included.
		if abortErr := p.abort(ctx); abortErr != nil {
			err = errors.Join(err, abortErr)
		}
		if r := recover(); r != nil {
			panic(r)
		}
	}()

	if err := fn(tx); err != nil {
		if isFenced(err) { // a record fn waited for was refused as fenced
			return ended("produce", err)
		}
		if refused := p.refused(err); refused != nil {
			return refused
		}
		return fmt.Errorf("%w: %w", ErrAborted, err)
	}
	if err := tx.promises.settle(ctx, tx.cl.Flush); err != nil {
		return fmt.Errorf("%w: flush: %w", ErrAborted, err)
	}
	if err := tx.err(); err != nil {
		if isFenced(err) {
			return ended("produce", err)
		}
		if refused := p.refused(err); refused != nil {
			return refused
		}
		return fmt.Errorf("%w: %w", ErrAborted, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrAborted, err)
	}

	endErr := cl.EndTransaction(ctx, kgo.TryCommit)
	switch {
	case endErr == nil:
		committed = true
		return nil
	case isFenced(endErr):
		return ended("commit", endErr)
	case authz.Refused(endErr):
		// Refused before anything was done: not committed. The abort is
		// refused too; the broker aborts at the transaction timeout.
		return p.refused(endErr)
	case abortable(endErr):
		// The commit was not attempted: the deferred abort makes the
		// outcome a known abort.
		return fmt.Errorf("%w: commit not attempted: %w", ErrAborted, endErr)
	default:
		if timedOut := ended("commit", endErr); errors.Is(timedOut, ErrTransactionTimedOut) {
			return timedOut // INVALID_TXN_STATE, say: aborted at its timeout
		}
		// The commit may or may not have landed; the deferred abort
		// retry reloads the producer id, which bumps the epoch.
		p.logger.Warn("eos: commit outcome unknown; retrying as abort", "err", endErr)
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, endErr)
	}
}

// refused turns a refusal for want of an ACL into an *[eoskit.AuthorizationError]
// naming it (the transaction not committed), and returns nil for anything
// else. A refused transactional id is final: franz-go fails the producer
// id for good, so the producer closes, and a new one is needed once the
// ACL is granted. A refused topic is not.
func (p *TransactionalProducer) refused(err error) error {
	if !authz.Refused(err) {
		return nil
	}
	topic := ""
	if pe, ok := errors.AsType[*ProduceError](err); ok {
		topic = pe.Topic
	}
	refusal := fmt.Errorf("%w: %w", ErrAborted, authz.Write(topic, p.txnID, "", err))
	if errors.Is(err, kerr.TransactionalIDAuthorizationFailed) && p.final == nil {
		p.final = refusal
		p.client().Close()
	}
	return refusal
}

// abort discards buffered records and ends the open transaction with an
// abort. It is a no-op when the transaction has already ended. An abort
// that fails leaves p.unaborted set, for the next Transact to try again.
func (p *TransactionalProducer) abort(ctx context.Context) (err error) {
	if p.final != nil {
		return nil
	}
	p.unaborted = true
	defer func() { p.unaborted = err != nil }()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	cl := p.client()
	if err := cl.AbortBufferedRecords(ctx); err != nil {
		return fmt.Errorf("eos: abort buffered records: %w", err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		if isFenced(err) {
			// An epoch error while aborting: the broker aborted the
			// transaction at its timeout (ended replaces the client,
			// the producer stays usable), or a newer producer fenced
			// this one and aborted it for us. Aborted either way.
			_ = p.ended(ctx, "abort", err, p.open.start, p.open.pid, p.open.epoch)
			return nil
		}
		return fmt.Errorf("eos: abort: %w", err)
	}
	return nil
}

// ended handles an epoch error (or a commit the broker refused) of the
// transaction that producer id pid began at epoch at start: when the
// transaction outlived its timeout and its coordinator shows it aborted
// with nobody else owning the id (coordinatorTimedOut), the client is
// replaced, since franz-go keeps a failed producer id for good, and
// ErrTransactionTimedOut is returned; otherwise classify decides. The
// caller's deferred abort then finds no transaction open on the new client.
func (p *TransactionalProducer) ended(ctx context.Context, op string, err error, start time.Time, pid int64, epoch int16) error {
	elapsed, old := time.Since(start), p.client()
	timeout := transactionTimeout(old)
	if elapsed < timeout || !coordinatorTimedOut(ctx, kadm.NewClient(old), p.txnID, pid, epoch) {
		return p.classify(op, err)
	}
	p.logger.Warn("eos: the transaction outlived its timeout and the broker aborted it; starting a new client",
		"elapsed", elapsed, "transaction_timeout", timeout)
	timedOut := fmt.Errorf("%w: %w (after %s): %w", ErrAborted, ErrTransactionTimedOut, elapsed.Round(time.Millisecond), err)
	old.Close()
	cl, newErr := newClient(p.cfg, RoleProducer)
	if newErr != nil {
		p.final = fmt.Errorf("eos: a new client after a timed-out transaction: %w", newErr)
		return errors.Join(timedOut, p.final)
	}
	p.cl.Store(cl)
	return timedOut
}

// classify turns a fencing error into the final ErrFenced state (closing the
// client) and passes any other error through, wrapped.
func (p *TransactionalProducer) classify(op string, err error) error {
	if !isFenced(err) {
		return fmt.Errorf("eos: %s: %w", op, err)
	}
	if p.final == nil {
		p.logger.Warn("eos: fenced by a newer producer with the same transactional id; closing", "err", err)
		p.final = fencedError(op, err)
		p.client().Close()
	}
	return p.final
}

// ProducerID returns the producer id and epoch the broker assigned to this
// transactional id, registering it first if this producer has not yet
// (which fences any older producer with the id and aborts its open
// transaction): a newer instance with the same id gets the same producer
// id with a higher epoch. Once this producer is fenced or closed, it
// returns that final error ([ErrFenced], [ErrClosed]).
func (p *TransactionalProducer) ProducerID(ctx context.Context) (id int64, epoch int16, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.final != nil {
		return 0, 0, p.final
	}
	id, epoch, err = p.client().ProducerID(ctx)
	if err != nil {
		return id, epoch, p.classify("producer id", err)
	}
	return id, epoch, nil
}

// Client returns the underlying franz-go client, for metrics and admin use.
// Do not begin or end transactions on it. A transaction that timed out
// (ErrTransactionTimedOut) replaces it and closes the old one: ask again
// after one.
func (p *TransactionalProducer) Client() *kgo.Client { return p.client() }

func (p *TransactionalProducer) client() *kgo.Client { return p.cl.Load() }

// Close closes the producer. Transact always ends the transaction it
// began; one whose abort could not reach its coordinator is aborted here
// once more (within 30 s), and otherwise left for the broker to abort at
// its transaction timeout.
func (p *TransactionalProducer) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unaborted && p.final == nil {
		if err := p.abort(context.Background()); err != nil {
			p.logger.Warn("eos: closing with a transaction whose abort has not gone through; the broker aborts it at its timeout", "err", err)
		}
	}
	if p.final == nil {
		p.final = fmt.Errorf("eos: %w", ErrClosed)
	}
	p.client().Close()
}
