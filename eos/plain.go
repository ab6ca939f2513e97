package eos

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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
	poll := func(ctx context.Context, n int) kgo.Fetches {
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
				return kgo.Fetches{}
			}
		}
		return f
	}
	for {
		fetches, stopped, err := loop.Poll(stop, poll, rn.pollSize(p.cfg.maxRecords), p.logger, p.refused)
		p.obs.Fetched(fetches)
		if stopped {
			return nil
		}
		if err != nil {
			return pollError(err)
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
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		flushErr := b.promises.settle(endCtx, rn.flush)
		_, produceErr := b.produceErr()
		var commitErr error
		if !atMostOnce && handled && flushErr == nil && produceErr == nil && ctx.Err() == nil {
			commitErr = cl.CommitRecords(endCtx, records...)
		}
		cancel()
		revoked.pending.Store(false)
		elapsed := time.Since(b.start)
		// Whatever failed once ctx ended failed because of it.
		shutdown := b.shutdown || ctx.Err() != nil

		switch {
		case atMostOnce && handled:
			// Whatever failed to produce is lost: that is the semantics.
			if produceErr != nil {
				p.logger.Warn("eos: at-most-once output lost", "err", produceErr)
			}
			p.obs.Committed(b.in, b.out, elapsed)
		case handled && flushErr == nil && produceErr == nil && commitErr == nil && ctx.Err() == nil:
			p.committed.Add(1)
			p.obs.Committed(b.in, b.out, elapsed)
			p.obs.DeadLettered(len(b.deadLetters))
			p.failures.committed(b)
			rn.isolate = false
		default:
			reason := "handler-error"
			switch {
			case shutdown:
				reason = "shutdown"
			case produceErr != nil || flushErr != nil:
				reason = "produce-error"
			case commitErr != nil:
				reason = "rebalance"
			}
			p.obs.Aborted(reason, elapsed)
			p.logger.Info("eos: batch not committed; its inputs will be read again", "reason", reason, "err", errors.Join(commitErr, flushErr))
			if shutdown {
				return nil
			}
			if err := p.afterFailure(ctx, rn, b); err != nil {
				return err
			}
			// Outputs already written stay written: at-least-once
			// duplicates them when the inputs are read again.
			rewind(cl, records)
		}
		cl.AllowRebalance()
	}
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
