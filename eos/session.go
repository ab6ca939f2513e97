package eos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/hanging"
	"github.com/eoskit/eoskit/internal/loop"
)

// runTransactional is one GroupTransactSession's life: it returns when ctx
// ends, on a final error, or with a *loop.RestartError.
func (p *Processor) runTransactional(ctx, stop context.Context) error {
	var revoked revokes
	// disconnected tells the hanging-transaction check that a broker
	// connection closed.
	var disconnected hanging.DisconnectFlag
	sess, err := kgo.NewGroupTransactSession(p.sessionOpts(&revoked, kgo.WithHooks(&disconnected))...)
	if err != nil {
		return p.cfg.clientOptionsError(err)
	}
	// Close leaves the group; by then no transaction is open, because every
	// path below ends the one it began.
	defer sess.Close()
	p.rearm.Store(false) // a new GroupTransactSession passes its first revoke on
	p.obs.WatchAssignment(p.logger, loop.SessionTimeout(sess.Client()))

	check, err := hanging.New(ctx, p.hangConfig(), sess.Client(), &disconnected)
	if err != nil {
		return err
	}
	check.BeforeClaim(ctx)
	poll := check.Poll(sess.PollRecords)
	// Before registering the transactional id, which bumps the epoch and
	// with it the coordinator's record of how the hanging transaction
	// ended: stopping or waiting changes nothing.
	if err := hangingError(check.Hold(ctx)); err != nil || ctx.Err() != nil {
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
	stopSweeps := check.Start(ctx)
	// Runs before the deferred Close: the check uses the session's client.
	defer stopSweeps()
	txnTimeout := transactionTimeout(sess.Client())
	rn := newRunner(p, sess.Client(), sess.Produce)
	rn.stop = stop
	rn.budget = transactionBudget(txnTimeout)
	s := &session{p: p, gts: sess, cl: sess.Client(), rn: rn, check: check, adm: kadm.NewClient(sess.Client()),
		timeout: txnTimeout, revoked: &revoked}
	if ks := p.state; ks != nil {
		if err := ks.open(p.cfg.connOpts(), sess.Client()); err != nil {
			return err
		}
		defer ks.close()
	}
	poll = p.wake.waking(poll)

	for {
		if err := hangingError(check.Hold(ctx)); err != nil || ctx.Err() != nil {
			return err
		}
		fetches, stopped, err := loop.Poll(stop, poll, rn.pollSize(p.perTxn), p.obs, p.logger, p.refused)
		if stopped {
			return nil
		}
		if err != nil {
			return pollError(err)
		}
		if fetches.NumRecords() == 0 {
			if err := s.rearm(ctx); err != nil {
				return err
			}
			// An idle instance restores what it was assigned too.
			if err := p.prepareState(ctx, fetches); err != nil || ctx.Err() != nil {
				return err
			}
			continue
		}

		// After a broker went away, this transaction could join a
		// hanging one: the check looks first.
		check.AfterDisconnect(ctx)
		if err := hangingError(check.Hold(ctx)); err != nil || ctx.Err() != nil {
			// The polled records are read again by whoever runs next:
			// no transaction took them.
			return err
		}
		// The stores of the polled partitions are restored before the
		// transaction begins (a restore may take longer than a
		// transaction may last).
		if err := p.prepareState(ctx, fetches); err != nil || ctx.Err() != nil {
			return err
		}
		if goOn, err := s.transact(ctx, fetches); !goOn {
			return err
		}
	}
}

// session is one GroupTransactSession's transactions, one after another
// (transact): each begins on a poll, takes the records the runner handles
// into its batch, ends (end), and its outcome (decideEnd) says what comes
// next (act).
//
// The keyed state (Changelog; keyedState) takes part at each step:
// partitions arrive and leave in the group's callbacks (groupHooks), which
// only mark them; the loop restores the polled partitions' stores before
// the transaction begins (prepare); handlers write through a scope each
// (runner.handle); end produces each partition's changes to the changelog
// before the outputs settle, so that they count for the commit; transact
// applies them to the stores if it committed and drops them otherwise
// (ended); and the stores are closed with the session, so that a restart
// restores them.
type session struct {
	p     *Processor
	gts   *kgo.GroupTransactSession
	cl    *kgo.Client // gts's
	rn    *runner
	check hanging.Check
	adm   *kadm.Client
	// timeout is the transaction timeout.
	timeout time.Duration
	// revoked records the group's revocations and losses (groupHooks).
	revoked *revokes
}

// transact runs one transaction: it begins it, handles fetches and what
// further polls bring into a batch (collect), ends it and acts on its
// outcome. It reports whether the session goes on, and otherwise returns
// what runTransactional returns.
func (s *session) transact(ctx context.Context, fetches kgo.Fetches) (goOn bool, err error) {
	p := s.p
	if err := s.gts.Begin(); err != nil {
		if authz.Refused(err) {
			return false, authz.Write("", p.cfg.txnID, p.cfg.group, err)
		}
		if isFenced(err) {
			p.obs.Fenced()
			return false, fencedError("begin transaction", err)
		}
		return false, loop.Restart(fmt.Errorf("begin transaction: %w", err))
	}
	// The epoch names this transaction for the hanging-transaction
	// check, which must know how it ended.
	producerID, txnEpoch, idErr := s.cl.ProducerID(ctx)
	b := &batch{start: time.Now()}
	handled := s.rn.collect(ctx, b, fetches, s.gts.PollRecords, &s.revoked.pending)
	e := s.end(ctx, b, handled)
	if p.state != nil {
		// The stores take the transaction's writes only if it committed
		// (an outcome unknown restarts the session, which restores).
		p.state.ended(e.committed)
	}
	if idErr == nil {
		b.mu.Lock()
		rec := hanging.Record{Firsts: make(map[hanging.TopicPartition]int64, len(b.firsts))}
		for tp, first := range b.firsts {
			rec.Firsts[hanging.TopicPartition{Topic: tp.topic, Partition: tp.partition}] = first
		}
		b.mu.Unlock()
		rec.Committed, rec.Known = e.knownOutcome()
		s.check.Ended(producerID, txnEpoch, rec)
	}
	e.elapsed = time.Since(b.start)
	// Whatever failed once ctx ended (a handler, a record produced
	// under ctx) failed because of it: a shutdown, not an error.
	e.shutdown = b.shutdown || ctx.Err() != nil
	e.failed, e.overBudget = b.failed != nil, b.overBudget
	e.timedOut = func() bool {
		return idErr == nil && coordinatorTimedOut(ctx, s.adm, p.cfg.txnID, producerID, txnEpoch)
	}
	e.abortKnown = func() bool { return p.knownAbort(ctx, s.cl, b) }
	return s.act(ctx, b, e, decideEnd(e))
}

// end settles b's outputs and ends its transaction: a commit when every
// polled record was handled, every output acknowledged and ctx is alive;
// an abort otherwise. It returns what the end came to, as far as it knows.
func (s *session) end(ctx context.Context, b *batch, handled bool) txnEnd {
	// Flush and settle every output before deciding: End commits
	// whatever was acknowledged, so a failed output must turn the
	// commit into an abort here.
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	e := txnEnd{timeout: s.timeout}
	if ks := s.p.state; ks != nil && handled && ctx.Err() == nil {
		ks.flush(endCtx, s.rn.produceUnblamed(b))
	}
	e.flushErr = b.promises.settle(endCtx, s.rn.flush)
	if ks := s.p.state; ks != nil {
		e.flushErr = errors.Join(e.flushErr, ks.takeErr())
	}
	_, e.produceErr = b.produceErr()
	e.wantCommit = handled && e.flushErr == nil && e.produceErr == nil && ctx.Err() == nil
	s.p.rearm.Store(false) // End re-arms franz-go's revoke callback (see rearm)
	e.revoked, e.committed, e.endErr = s.revoked.end(func() (bool, error) {
		return s.gts.End(endCtx, kgo.TransactionEndTry(e.wantCommit))
	})
	return e
}

// rearm ends the GroupTransactSession's transaction while none is under
// way, after the group took partitions from an idle session. franz-go
// passes the group's revokes (and losses) on only once between two
// transaction ends, and an idle session ends none: without it, the
// revokes after the first would never reach the processor's callbacks,
// and its health, its state view and the user's hooks would go on
// listing partitions other members hold. Nothing was polled since the
// last end, so the abort drops nothing; its End also rewinds the client
// to the committed offsets, so it must never run with records polled and
// not yet ended. It runs after each idle poll; a revoke that comes while
// an earlier one waits for the next of these (a transaction, a restore of
// polled partitions before it, the hanging check holding the loop) is
// still dropped by franz-go.
func (s *session) rearm(ctx context.Context) error {
	if !s.p.rearm.Load() {
		return nil // no revoke since the last End
	}
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	s.p.rearm.Store(false) // a revoke from here on is passed on, and marks it again
	_, _, err := s.revoked.end(func() (bool, error) { return s.gts.End(endCtx, kgo.TryAbort) })
	if err != nil && ctx.Err() == nil {
		return loop.Restart(fmt.Errorf("end the idle session's empty transaction after a revoke: %w", err))
	}
	return nil
}

// act does what o, the outcome of b's transaction, whose end came to e,
// asks: it reports whether the session goes on, and otherwise returns what
// runTransactional returns.
func (s *session) act(ctx context.Context, b *batch, e txnEnd, o endOutcome) (goOn bool, err error) {
	p := s.p
	switch o.kind {
	case endCommitted:
		s.committed(b, e.elapsed)
		return true, nil
	case endRebalanced, endBatchFailed, endShutDown:
		return s.aborted(ctx, b, e, o)
	case endRefused:
		// The transactional id (EndTxn, AddOffsetsToTxn) or the group
		// (TxnOffsetCommit) refused. franz-go's abort is refused too:
		// the broker aborts the transaction at its timeout, and until
		// then read_committed readers of its partitions wait.
		p.obs.Aborted(o.reason, e.elapsed)
		if sw := refusedStateWrite(e.flushErr); sw != nil {
			return false, authz.Write(sw.topic, p.cfg.txnID, p.cfg.group, sw)
		}
		if err := authz.Write("", p.cfg.txnID, p.cfg.group, e.endErr); err != nil {
			return false, err
		}
		// decideEnd calls nothing else refused: never, but not a nil
		// that would end Run as if shut down.
		return false, loop.Restart(fmt.Errorf("end transaction refused: %w", errors.Join(e.endErr, e.flushErr)))
	case endTimedOut:
		// The coordinator aborted the transaction and bumped the epoch,
		// which is what the epoch error says, and nobody registered the
		// id since. A new session registers the transactional id again
		// and goes on.
		p.obs.Aborted(o.reason, e.elapsed)
		p.perTxn = max(1, b.in/2) // kept by the next session
		p.logger.Warn("eos: the transaction outlived its timeout and the broker aborted it; restarting the session (keep CommitInterval and handler time well below TransactionTimeout)",
			"elapsed", e.elapsed, "transaction_timeout", e.timeout, "records_in", b.in)
		return false, loop.Restart(fmt.Errorf("transaction outlived its timeout (%s > %s): %w", e.elapsed.Round(time.Millisecond), e.timeout, errors.Join(e.endErr, e.produceErr, e.flushErr)))
	case endConfig:
		// Aborted by franz-go (no commit was asked for with a failure
		// noted); the setting ends Run.
		p.obs.Aborted(o.reason, e.elapsed)
		var cerr *eoskit.ConfigError
		if errors.As(e.flushErr, &cerr) {
			return false, cerr
		}
		return false, e.flushErr
	case endFenced:
		p.obs.Fenced()
		p.obs.Aborted(o.reason, e.elapsed)
		p.logger.Warn("eos: fenced by a newer instance with the same transactional id; stopping")
		return false, fencedError("end transaction", errors.Join(e.endErr, e.produceErr, e.flushErr))
	case endUnknown:
		p.obs.Aborted(o.reason, e.elapsed)
		return false, loop.Restart(fmt.Errorf("end transaction: %w", errors.Join(e.endErr, e.flushErr)))
	default: // endUnconfirmed
		p.obs.Aborted(o.reason, e.elapsed)
		p.logger.Warn("eos: a commit ended unconfirmed with no rebalance; its outcome is unknown, restarting the session to read the committed offsets from the broker", "records_in", b.in)
		return false, loop.Restart(errors.New("commit not confirmed and no partition revoked: outcome unknown"))
	}
}

// committed notes that b's transaction committed: the processor forgets
// the failures it settled and takes more records per transaction again
// while transactions end well within their budget.
func (s *session) committed(b *batch, elapsed time.Duration) {
	p := s.p
	p.committed.Add(1)
	p.obs.Committed(b.in, b.out, elapsed)
	p.obs.DeadLettered(len(b.deadLetters))
	p.failures.committed(b)
	s.rn.isolate = false
	if b.in >= p.perTxn && p.perTxn < p.cfg.maxRecords {
		switch {
		case elapsed < s.rn.budget/8:
			p.perTxn = min(2*p.perTxn, p.cfg.maxRecords)
		case elapsed < s.rn.budget/2:
			p.perTxn = min(p.perTxn+max(1, p.perTxn/4), p.cfg.maxRecords)
		}
	}
}

// aborted acts on a transaction known to have aborted (o: a rebalance, a
// failure in the batch, or a shutdown), whose inputs are read again.
func (s *session) aborted(ctx context.Context, b *batch, e txnEnd, o endOutcome) (goOn bool, err error) {
	p := s.p
	p.obs.Aborted(o.reason, e.elapsed)
	p.logger.Info("eos: transaction aborted; its inputs will be read again", "reason", o.reason, "records_in", b.in)
	if o.kind == endShutDown {
		return false, nil
	}
	if b.overBudget {
		p.perTxn = b.next
		p.logger.Warn("eos: handlers ran out of the transaction's budget before the polled records were handled; ended the transaction early and taking fewer records per transaction",
			"budget", s.rn.budget, "records_in", b.in, "records_per_transaction", p.perTxn)
	}
	if o.kind == endRebalanced {
		return true, nil // the records come back to whoever owns them now
	}
	if err := p.afterFailure(ctx, s.rn, b); err != nil {
		return false, err
	}
	return true, nil
}

// claimPatience is how long a new session retries registering its
// transactional id before it gives up and restarts (the hanging check's,
// which sweeps as long before the claim).
const claimPatience = hanging.ClaimPatience

// claimTransactionalID initialises cl's producer id, retrying in place
// (100 ms doubling to 1 s) while the broker cannot answer. It returns nil
// once registered or when ctx ends; ErrFenced when a newer instance holds
// the id; a *loop.RestartError after claimPatience.
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
			return loop.Restart(fmt.Errorf("init producer id: %w", err))
		}
		p.logger.Warn("eos: registering the transactional id failed; retrying", "err", err, "backoff", backoff)
		if !loop.Sleep(ctx, backoff) {
			return nil
		}
	}
}

// sessionOpts notes a new session and returns the options of its client:
// the configured ones, the group's callbacks (groupHooks), which set
// revoked, and extra.
func (p *Processor) sessionOpts(revoked *revokes, extra ...kgo.Opt) []kgo.Opt {
	p.obs.NewSession() // before the group can assign anything to it
	opts := append(p.cfg.kgoOpts(RoleProducer, RoleConsumer), p.groupHooks(revoked)...)
	return append(opts, extra...)
}

// groupHooks returns options that record revocations: a batch stops early
// once the group took partitions, since it can no longer commit. Under the
// cooperative-sticky balancer (franz-go's default) every group session
// ends with a revoke of nothing: that takes nothing, and the batch goes on
// (franz-go's GroupTransactSession lets its commit through too), with the
// guard against an unknown commit outcome in force.
//
// A revoke of nothing under an eager balancer (range, round-robin,
// sticky: a member that held nothing at a rebalance), and any loss, empty
// or not, latch the GroupTransactSession until its next End, which drops
// every revoke and loss meanwhile: so any revoke or loss, empty ones
// included, asks an idle session to re-arm (session.rearm). Under a
// cooperative group the empty revoke does not latch, and the re-arm is one
// empty abort, which no one sees.
func (p *Processor) groupHooks(revoked *revokes) []kgo.Opt {
	onTaken := func(what string) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			if len(parts) == 0 {
				p.rearm.Store(true)
				p.wake.signal() // an idle session re-arms (session.rearm)
				p.logger.Debug("eos: group session ended; no partition " + what)
				return
			}
			revoked.taken()
			p.rearm.Store(true)
			if p.state != nil {
				p.state.takenAway(parts[p.state.input])
			}
			p.wake.signal() // an idle session re-arms (session.rearm)
			if what == "lost" {
				p.obs.Lost(parts)
			} else {
				p.obs.Revoked(parts)
			}
			p.logger.Info("eos: partitions "+what, "partitions", parts)
		}
	}
	assigned := func(_ context.Context, cl *kgo.Client, parts map[string][]int32) {
		if p.state != nil && len(parts[p.state.input]) > 0 {
			p.state.assigned(cl, parts[p.state.input])
			p.wake.signal() // an idle session restores them
		}
		p.obs.Assigned(parts)
		p.logger.Info("eos: partitions assigned", "partitions", parts)
	}
	return loop.GroupHooks(loop.Hooks{Assigned: assigned, Revoked: onTaken("revoked"), Lost: onTaken("lost")}, p.userHooks)
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
func (p *Processor) hangConfig() hanging.Config {
	return hanging.Config{Interval: p.cfg.hangCheck, Policy: p.cfg.onHang.kind, Group: p.cfg.group, TxnID: p.cfg.txnID,
		Conn: p.cfg.connOpts(), Logger: p.logger, Found: hangMetrics{p.obs.Metrics}.hanging,
		History: &p.hangs, Committed: func() bool { return p.committed.Load() > 0 }}
}
