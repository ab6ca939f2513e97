package eos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"
)

// runPlain is the loop for AtLeastOnce and AtMostOnce: the same handler and
// batching as the transactional loop, with a plain client and offsets
// committed after the outputs were acknowledged (at-least-once) or before the
// records are handled (at-most-once). It exists so that the weaker
// semantics are one option away, measurable and testable against the same
// workload; it makes no exactly-once promise.
func (p *Processor) runPlain(ctx, stop context.Context) error {
	var revoked revokes
	// Holding the rebalance until the batch's offsets are committed keeps
	// a batch from being committed by a member that no longer owns it.
	cl, err := kgo.NewClient(p.sessionOpts(&revoked, kgo.BlockRebalanceOnPoll())...)
	if err != nil {
		return p.cfg.clientOptionsError(err)
	}
	// Close alone would wait forever for a rebalance that the last poll
	// blocked.
	defer cl.CloseAllowingRebalance()
	p.obs.WatchAssignment(p.logger, loop.SessionTimeout(cl))

	atMostOnce := p.cfg.semantics == AtMostOnce
	rn := newRunner(p, cl, cl.Produce)
	rn.stop = stop
	// commitFailures counts the offset commits in a row that failed for
	// no rebalance: each waits a backoff (the rebalance allowed) before
	// the batch is read again, and past maxCommitFailures the session
	// restarts, within the shell's bound. refusedCommit is a commit
	// refused for good (an ACL, another process with this InstanceID):
	// nothing is polled once it is set, and Run ends with it.
	var commitFailures int
	var refusedCommit error
	pause := func(err error) error {
		commitFailures++
		if commitFailures >= maxCommitFailures {
			return loop.Restart(fmt.Errorf("eos: %d offset commits in a row failed: %w", commitFailures, err))
		}
		cl.AllowRebalance() // nothing to commit is held: the group need not wait
		loop.PauseBeforeRetry(stop, commitFailures)
		return nil
	}
	var restart error
	poll := func(ctx context.Context, n int) kgo.Fetches {
		if refusedCommit != nil || restart != nil {
			return kgo.Fetches{}
		}
		f := cl.PollRecords(ctx, n)
		if atMostOnce && f.NumRecords() > 0 {
			// At-most-once: the offsets are committed before the
			// records are handled, so a crash from here on loses them.
			// Records whose commit failed are not handled at all: the
			// group may already have given them to another member, and
			// handling them here too would duplicate them.
			if err := cl.CommitRecords(context.WithoutCancel(ctx), f.Records()...); err != nil {
				p.logger.Warn("eos: commit before processing failed; not handling the records", "err", err)
				rewind(cl, f.Records())
				switch o := decideEnd(txnEnd{wantCommit: true, commitErr: err}); {
				case o.kind == endRefused || o.kind == endFenced:
					refusedCommit = err
				case o.reason == "commit-error":
					restart = pause(err)
				}
				return kgo.Fetches{}
			}
			commitFailures = 0
		}
		return f
	}
	for {
		fetches, stopped, err := loop.Poll(stop, poll, rn.pollSize(p.cfg.maxRecords), p.obs, p.logger, p.refused)
		if stopped {
			return nil
		}
		if err != nil {
			return pollError(err)
		}
		if refusedCommit != nil {
			return commitRefused(p.cfg.group, refusedCommit)
		}
		if restart != nil {
			return restart
		}
		if fetches.NumRecords() == 0 {
			cl.AllowRebalance()
			continue
		}

		b := &batch{start: time.Now()}
		var records []*kgo.Record
		collectPoll := func(ctx context.Context, n int) kgo.Fetches {
			f := poll(ctx, n)
			records = append(records, f.Records()...)
			return f
		}
		records = append(records, fetches.Records()...)
		handled := rn.collect(ctx, b, fetches, collectPoll, &revoked.pending)
		e := p.endPlain(ctx, cl, b, records, handled, rn)
		revoked.pending.Store(false)
		if refusedCommit != nil || restart != nil {
			// A commit before processing (at most once) failed for good
			// while the batch was collected: its records were never
			// handled, and nothing more is polled.
			p.obs.Aborted("refused", e.elapsed)
			if refusedCommit != nil {
				return commitRefused(p.cfg.group, refusedCommit)
			}
			return restart
		}
		switch o := decideEnd(e); {
		case o.kind == endCommitted:
			commitFailures = 0
			p.committed.Add(1)
			p.obs.Committed(b.in, b.out, e.elapsed)
			p.obs.DeadLettered(len(b.deadLetters))
			p.failures.committed(b)
			rn.isolate = false
		case (o.kind == endRefused || o.kind == endFenced) && e.commitErr != nil:
			// The group refused the offset commit (an ACL revoked while
			// Run runs), or another process runs with this InstanceID:
			// final, as a transaction's refusal is, not a rebalance to
			// retry for ever.
			p.obs.Aborted(o.reason, e.elapsed)
			return commitRefused(p.cfg.group, e.commitErr)
		default: // endShutDown, endRebalanced, endBatchFailed; an output fenced
			p.obs.Aborted(o.reason, e.elapsed)
			p.logger.Info("eos: batch not committed; its inputs will be read again", "reason", o.reason, "err", errors.Join(e.produceErr, e.commitErr))
			if o.kind == endShutDown {
				return nil
			}
			if err := p.afterFailure(ctx, rn, b); err != nil {
				return err
			}
			// Outputs already written stay written: at-least-once
			// duplicates them when the inputs are read again.
			rewind(cl, records)
			if o.reason == "commit-error" {
				// Not read again at once: a commit failing for
				// another reason than a rebalance may fail a while.
				if err := pause(e.commitErr); err != nil {
					return err
				}
			} else {
				commitFailures = 0
			}
		}
		cl.AllowRebalance()
	}
}

// endPlain settles b's outputs and, at least once, commits the offsets
// of records once every polled record was handled and every output
// acknowledged: what the batch came to, for decideEnd, which decides a
// plain batch's end as it decides a transaction's. There is no
// transaction whose outcome could be unknown: an output not acknowledged
// failed, and a commit the group refused (the partitions went to another
// member) did not happen. At most once, the offsets were committed at the
// poll, and a handled batch is committed whatever its outputs did (those
// that failed are lost, and logged).
func (p *Processor) endPlain(ctx context.Context, cl *kgo.Client, b *batch, records []*kgo.Record, handled bool, rn *runner) txnEnd {
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	e := txnEnd{
		timeout: endTimeout,
		// Never asked: no transaction, and a commit either happened or
		// failed (commitErr).
		timedOut:   func() bool { return false },
		abortKnown: func() bool { return false },
	}
	flushErr := b.promises.settle(endCtx, rn.flush)
	_, produceErr := b.produceErr()
	produceErr = errors.Join(produceErr, flushErr)
	if p.cfg.semantics == AtMostOnce && handled {
		if produceErr != nil {
			p.logger.Warn("eos: at-most-once output lost", "err", produceErr)
		}
		e.wantCommit, e.committed = true, true
	} else {
		e.produceErr = produceErr
		e.wantCommit = handled && produceErr == nil && ctx.Err() == nil
		if e.wantCommit {
			e.commitErr = cl.CommitRecords(endCtx, records...)
			e.committed = e.commitErr == nil
		}
	}
	e.elapsed = time.Since(b.start)
	// Whatever failed once ctx ended failed because of it.
	e.shutdown = b.shutdown || ctx.Err() != nil
	e.failed, e.overBudget = b.failed != nil, b.overBudget
	return e
}

// rewind sets the consumer back to the first record of each partition in
// records, so that an uncommitted batch is read again.
func rewind(cl *kgo.Client, records []*kgo.Record) {
	first := map[string]map[int32]kgo.EpochOffset{}
	for _, r := range records {
		if first[r.Topic] == nil {
			first[r.Topic] = map[int32]kgo.EpochOffset{}
		}
		if _, ok := first[r.Topic][r.Partition]; !ok {
			first[r.Topic][r.Partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
		}
	}
	cl.SetOffsets(first)
}

// maxCommitFailures is how many offset commits in a row may fail, for no
// rebalance, before the session restarts.
const maxCommitFailures = 10

// commitRefused is the error of a plain batch's offset commit refused for
// good: what it needs (Read on the group, or on the input topics), or
// another process with the same InstanceID.
func commitRefused(group string, err error) error {
	if errors.Is(err, kerr.FencedInstanceID) {
		return fmt.Errorf("%w: another process of group %s runs with this InstanceID: %w", ErrFenced, group, err)
	}
	if errors.Is(err, kerr.TopicAuthorizationFailed) {
		return &eoskit.AuthorizationError{Permission: "Read on the input topics (to commit their offsets)", Err: err}
	}
	return &eoskit.AuthorizationError{Permission: "Read on group " + group, Err: err}
}
