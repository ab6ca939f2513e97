package eos

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/loop"
)

// claimPatience is how long a new session retries registering its
// transactional id before it gives up and restarts: longer than a broker
// restart, so that a bounce costs no more than the bounce itself.
const claimPatience = time.Minute

// claimTransactionalID initialises cl's producer id, retrying in place
// (100 ms doubling to 1 s) while the broker cannot answer. It returns nil
// once registered or when ctx ends; ErrFenced when a newer instance holds
// the id; a *restartError after claimPatience.
func (p *Processor) claimTransactionalID(ctx context.Context, cl *kgo.Client) error {
	deadline := time.Now().Add(claimPatience)
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		_, _, err := cl.ProducerID(ctx)
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case authz.Refused(err):
			return authz.Write("", p.cfg.txnID, p.cfg.group, err)
		case isFenced(err):
			p.obs.Fenced()
			return fencedError("init producer id", err)
		case time.Now().After(deadline):
			return &restartError{fmt.Errorf("init producer id: %w", err)}
		}
		p.logger.Warn("eos: registering the transactional id failed; retrying", "err", err, "backoff", backoff)
		if !loop.Sleep(ctx, backoff) {
			return nil
		}
	}
}

// groupHooks returns options that record revocations: a batch stops early
// once the group took partitions, since it can no longer commit. Under the
// cooperative-sticky balancer (franz-go's default) every group session
// ends with a revoke of nothing: that takes nothing, and the batch goes on
// (franz-go's GroupTransactSession lets its commit through too), with the
// guard against an unknown commit outcome in force.
func (p *Processor) groupHooks(revoked *atomic.Bool) []kgo.Opt {
	onTaken := func(what string) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			if len(parts) == 0 {
				p.logger.Debug("eos: group session ended; no partition " + what)
				return
			}
			revoked.Store(true)
			if what == "lost" {
				p.obs.Lost(parts)
			} else {
				p.obs.Revoked(parts)
			}
			p.logger.Info("eos: partitions "+what, "partitions", parts)
		}
	}
	return []kgo.Opt{
		kgo.OnPartitionsAssigned(loop.Chain(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			p.obs.Assigned(parts)
			p.logger.Info("eos: partitions assigned", "partitions", parts)
		}, p.userHooks.Assigned)),
		kgo.OnPartitionsRevoked(loop.Chain(onTaken("revoked"), p.userHooks.Revoked)),
		kgo.OnPartitionsLost(loop.Chain(onTaken("lost"), p.userHooks.Lost)),
	}
}

// transactionBudget is how long a transaction may spend handling records:
// three quarters of the transaction timeout, leaving the rest to flush and
// end it before the broker aborts it.
func transactionBudget(txnTimeout time.Duration) time.Duration { return txnTimeout * 3 / 4 }

// transactionTimeout is the client's transaction timeout (franz-go's
// default, 40 s, unless kgo.TransactionTimeout set it).
func transactionTimeout(cl *kgo.Client) time.Duration {
	d, _ := cl.OptValue(kgo.TransactionTimeout).(time.Duration)
	return d
}

// hangConfig returns what each session's hanging-transaction check is
// built from.
func (p *Processor) hangConfig() hangConfig {
	return hangConfig{interval: p.cfg.hangCheck, policy: p.cfg.onHang, group: p.cfg.group, txnID: p.cfg.txnID,
		clientOpts: p.cfg.clientOpts, brokers: p.cfg.brokers, logger: p.logger, metrics: hangMetrics{p.obs.Metrics},
		history: &p.hangs, committed: func() bool { return p.committed.Load() > 0 }}
}

// runTransactional is one GroupTransactSession's life: it returns when ctx
// ends, on a final error, or with a *restartError.
func (p *Processor) runTransactional(ctx, stop context.Context) error {
	var revoked atomic.Bool
	opts := append(p.cfg.kgoOpts(RoleProducer, RoleConsumer), p.groupHooks(&revoked)...)
	// disconnected tells the hanging-transaction check that a broker
	// connection closed.
	var disconnected disconnectFlag
	opts = append(opts, kgo.WithHooks(&disconnected))
	p.obs.NewSession() // before the group can assign anything to it
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return &eoskit.ConfigError{Package: "eos", Setting: "ClientOptions", Semantics: checkedAgainst(p.cfg.semantics), Reason: err.Error(), Err: err}
	}
	// Close leaves the group; by then no transaction is open, because every
	// path below ends the one it began.
	defer sess.Close()
	p.obs.WatchAssignment(p.logger, loop.SessionTimeout(sess.Client()))

	check, err := newHangingCheck(ctx, p.hangConfig(), sess.Client(), &disconnected)
	if err != nil {
		return err
	}
	check.beforeClaim(ctx)
	poll := check.poll(sess.PollRecords)
	// Before registering the transactional id, which bumps the epoch and
	// with it the coordinator's record of how the hanging transaction
	// ended: stopping or waiting changes nothing.
	if err := check.hold(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	// Claim the transactional id before consuming, as Kafka Streams'
	// initTransactions does. A predecessor with this id (this process's
	// previous session, or a process that died) may have left a
	// transaction open whose abort never reached the broker; while it is
	// open, its pending offset commits make the group's offset fetch
	// answer UNSTABLE_OFFSET_COMMIT, so this session gets no records, and
	// franz-go initialises the producer id only on a first produce: the
	// partitions would stall until the broker times the transaction out.
	// InitProducerID bumps the epoch, which aborts that transaction now
	// and fences its owner.
	if err := p.claimTransactionalID(ctx, sess.Client()); err != nil || ctx.Err() != nil {
		return err
	}
	stopSweeps := check.start(ctx)
	// Runs before the deferred Close: the check uses the session's client.
	defer stopSweeps()

	rn := newRunner(p, sess.Client(), sess.Produce)
	rn.stop = stop
	adm := kadm.NewClient(sess.Client())
	txnTimeout := transactionTimeout(sess.Client())
	rn.budget = transactionBudget(txnTimeout)
	for {
		if err := check.hold(ctx); err != nil || ctx.Err() != nil {
			return err
		}
		fetches, stopped, err := loop.Poll(stop, poll, min(p.perTxn, p.cfg.maxPoll()), p.logger, p.refused)
		p.obs.Fetched(fetches)
		if stopped {
			return nil
		}
		if err != nil {
			return pollError(err)
		}
		if fetches.NumRecords() == 0 {
			continue
		}

		// After a broker went away, this transaction could join a
		// hanging one: the check looks first.
		check.afterDisconnect(ctx)
		if err := check.hold(ctx); err != nil || ctx.Err() != nil {
			// The polled records are read again by whoever runs next:
			// no transaction took them.
			return err
		}
		if err := sess.Begin(); err != nil {
			if authz.Refused(err) {
				return authz.Write("", p.cfg.txnID, p.cfg.group, err)
			}
			if isFenced(err) {
				p.obs.Fenced()
				return fencedError("begin transaction", err)
			}
			return &restartError{fmt.Errorf("begin transaction: %w", err)}
		}
		// The epoch names this transaction for the hanging-transaction
		// check, which must know how it ended.
		producerID, txnEpoch, idErr := sess.Client().ProducerID(ctx)
		b := &batch{start: time.Now()}
		handled := rn.collect(ctx, b, fetches, sess.PollRecords, &revoked)

		// Flush and settle every output before deciding: End commits
		// whatever was acknowledged, so a failed output must turn the
		// commit into an abort here.
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		flushErr := b.promises.settle(endCtx, rn.flush)
		_, produceErr := b.produceErr()
		wantCommit := handled && flushErr == nil && produceErr == nil && ctx.Err() == nil
		committed, endErr := sess.End(endCtx, kgo.TransactionEndTry(wantCommit))
		cancel()
		if idErr == nil {
			b.mu.Lock()
			rec := txnRecord{firsts: b.firsts}
			b.mu.Unlock()
			switch {
			case !wantCommit:
				rec.known = true // never asked to commit: it aborts
			case committed:
				rec.committed, rec.known = true, true
			}
			// A wanted commit that ended not committed may have
			// committed at the broker (see below): its outcome stays
			// unknown.
			check.ended(producerID, txnEpoch, rec)
		}
		sawRevoke := revoked.Swap(false)
		elapsed := time.Since(b.start)
		// Whatever failed once ctx ended (a handler, a record produced
		// under ctx) failed because of it: a shutdown, not an error.
		b.shutdown = b.shutdown || ctx.Err() != nil

		switch {
		case authz.Refused(endErr):
			// The transactional id (EndTxn, AddOffsetsToTxn) or the
			// group (TxnOffsetCommit) refused. franz-go's abort is
			// refused too: the broker aborts the transaction at its
			// timeout, and until then read_committed readers of its
			// partitions wait.
			p.obs.Aborted("refused", elapsed)
			return authz.Write("", p.cfg.txnID, p.cfg.group, endErr)
		case (isFenced(endErr) || isFenced(produceErr) || isFenced(flushErr)) && elapsed >= txnTimeout &&
			idErr == nil && coordinatorTimedOut(ctx, adm, p.cfg.txnID, producerID, txnEpoch):
			// The transaction outlived its timeout: the coordinator
			// aborted it and bumped the epoch, which is what the epoch
			// error says, and nobody registered the id since (a zombie
			// woken past its timeout after its successor started is
			// fenced, below: restarting would fence the successor). A
			// new session registers the transactional id again and
			// goes on.
			p.obs.Aborted("timeout", elapsed)
			p.perTxn = max(1, b.in/2) // kept by the next session
			p.logger.Warn("eos: the transaction outlived its timeout and the broker aborted it; restarting the session (keep CommitInterval and handler time well below TransactionTimeout)",
				"elapsed", elapsed, "transaction_timeout", txnTimeout, "records_in", b.in)
			return &restartError{fmt.Errorf("transaction outlived its timeout (%s > %s): %w", elapsed.Round(time.Millisecond), txnTimeout, errors.Join(endErr, produceErr, flushErr))}
		case isFenced(endErr) || isFenced(produceErr) || isFenced(flushErr):
			p.obs.Fenced()
			p.obs.Aborted("fenced", elapsed)
			p.logger.Warn("eos: fenced by a newer instance with the same transactional id; stopping")
			return fencedError("end transaction", errors.Join(endErr, produceErr, flushErr))
		case endErr != nil || flushErr != nil:
			p.obs.Aborted("outcome-unknown", elapsed)
			return &restartError{fmt.Errorf("end transaction: %w", errors.Join(endErr, flushErr))}
		case committed:
			p.committed.Add(1)
			p.obs.Committed(b.in, b.out, elapsed)
			p.obs.DeadLettered(len(b.deadLetters))
			p.forgetDeadLetters(b)
			rn.isolate = false
			if b.in >= p.perTxn && p.perTxn < p.cfg.maxRecords {
				switch {
				case elapsed < rn.budget/8:
					p.perTxn = min(2*p.perTxn, p.cfg.maxRecords)
				case elapsed < rn.budget/2:
					p.perTxn = min(p.perTxn+max(1, p.perTxn/4), p.cfg.maxRecords)
				}
			}
			continue
		case wantCommit && !b.shutdown && !sawRevoke && !p.knownAbort(ctx, sess.Client(), b):
			// A commit was asked for and ended as not committed, with
			// no partition taken, and the broker's committed offsets
			// do not show it aborted: franz-go retried a failed EndTxn
			// (UNKNOWN_SERVER_ERROR, say) as an abort, and the broker
			// may have committed. This session's view of the committed
			// offsets (franz-go's) may be older than the broker's:
			// going on would copy a committed batch again. A new
			// session reads the offsets from the broker.
			p.obs.Aborted("outcome-unknown", elapsed)
			p.logger.Warn("eos: a commit ended unconfirmed with no rebalance; its outcome is unknown, restarting the session to read the committed offsets from the broker", "records_in", b.in)
			return &restartError{errors.New("commit not confirmed and no partition revoked: outcome unknown")}
		}

		reason := "rebalance"
		switch {
		case b.shutdown:
			reason = "shutdown"
		case b.failed != nil:
			reason = "handler-error"
		case produceErr != nil:
			reason = "produce-error"
		case b.overBudget:
			reason = "budget"
		}
		p.obs.Aborted(reason, elapsed)
		p.logger.Info("eos: transaction aborted; its inputs will be read again", "reason", reason, "records_in", b.in)
		if b.shutdown {
			return nil
		}
		if b.overBudget {
			p.perTxn = b.next
			p.logger.Warn("eos: handlers ran out of the transaction's budget before the polled records were handled; ended the transaction early and taking fewer records per transaction",
				"budget", rn.budget, "records_in", b.in, "records_per_transaction", p.perTxn)
		}
		if wantCommit {
			continue // a rebalance: the records come back to whoever owns them now
		}
		if err := p.afterFailure(ctx, rn, b); err != nil {
			return err
		}
	}
}
