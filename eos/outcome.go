package eos

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
)

// How a transaction's end turned out, and what the session does about it,
// is decided in one place, decideEnd, from what the end came to (a txnEnd);
// the session acts on the answer (session.act).

// txnEnd is what the end of one transaction came to: what decideEnd needs
// to know.
type txnEnd struct {
	// wantCommit is set when a commit was asked for: every polled record
	// handled, every output acknowledged, Run's ctx alive. committed and
	// endErr are End's answer; flushErr is the settling of the outputs
	// (the flush, or a promise that did not return), produceErr the
	// first output that failed.
	wantCommit, committed        bool
	endErr, flushErr, produceErr error
	// commitErr is a plain batch's offset commit that failed (see
	// endPlain): the group refused it, so it did not happen.
	commitErr error
	// elapsed is how long the transaction took, timeout the transaction
	// timeout.
	elapsed, timeout time.Duration
	// shutdown: Run's ctx ended (past the drain). revoked: the group took
	// partitions during the transaction, before its End began (see
	// revokes), so franz-go aborted it untried. failed: a handler failed (or was
	// too slow) under Stop or Retry. overBudget: the budget ran out
	// before the polled records were handled.
	shutdown, revoked, failed, overBudget bool
	// timedOut asks the coordinator whether the transaction was aborted
	// for outliving its timeout, with nobody else owning the id (see
	// coordinatorTimedOut); abortKnown asks the group's offsets whether
	// an unconfirmed commit aborted (see knownAbort). decideEnd asks each
	// at most once, only when the answer decides.
	timedOut, abortKnown func() bool
}

// endKind is what the session does after a transaction ended.
type endKind int8

const (
	// endCommitted: the transaction committed; the session goes on.
	endCommitted endKind = iota
	// endRebalanced: a commit was asked for and the transaction is known
	// to have aborted (a rebalance, a group error): its records go to
	// whoever owns their partitions now; the session goes on.
	endRebalanced
	// endBatchFailed: no commit was asked for, because a record, an
	// output or the budget failed: the error policy applies, and the
	// session goes on unless it says to stop.
	endBatchFailed
	// endShutDown: Run's ctx ended past the drain; the session ends.
	endShutDown
	// endRefused: the broker refused an ACL the transaction needs: final.
	endRefused
	// endFenced: a newer instance with the transactional id took over:
	// final.
	endFenced
	// endTimedOut: the transaction outlived its timeout and the
	// coordinator aborted it: a new session, with fewer records per
	// transaction.
	endTimedOut
	// endUnknown: End or the outputs' settling failed, and whether the
	// transaction committed is unknown: a new session, which reads the
	// committed offsets from the broker.
	endUnknown
	// endConfig: the transaction met a setting that no retry cures (a
	// partition the input gained since Run started): final, with it.
	endConfig
	// endUnconfirmed: a commit asked for ended not committed, with no
	// partition taken, and the group's offsets do not show it aborted:
	// franz-go retried a failed EndTxn as an abort, and the broker may
	// have committed. Going on would rewind to franz-go's view of the
	// committed offsets, maybe older than the broker's, and copy a
	// committed batch again: a new session.
	endUnconfirmed
)

// endOutcome is what decideEnd makes of a transaction's end.
type endOutcome struct {
	kind endKind
	// reason says why a transaction did not commit, as the aborted
	// metric labels it.
	reason string
}

// decideEnd makes the outcome of a transaction's end.
func decideEnd(e txnEnd) endOutcome {
	fenced := isFenced(e.endErr) || isFenced(e.produceErr) || isFenced(e.flushErr)
	switch {
	case authz.Refused(e.endErr), authz.Refused(e.commitErr):
		return endOutcome{endRefused, "refused"}
	case errors.Is(e.commitErr, kerr.FencedInstanceID):
		// Another process runs with this InstanceID: final, as franz-go
		// does not rejoin on it.
		return endOutcome{endFenced, "fenced"}
	case fenced && e.elapsed >= e.timeout && e.timedOut():
		// A zombie woken past its timeout after its successor started is
		// fenced (below): restarting would fence the successor.
		return endOutcome{endTimedOut, "timeout"}
	case fenced:
		return endOutcome{endFenced, "fenced"}
	case errors.Is(e.flushErr, eoskit.ErrInvalidConfig):
		return endOutcome{endConfig, "refused"}
	case refusedStateWrite(e.flushErr) != nil:
		// The changelog or the updates topic the processor may not
		// write.
		return endOutcome{endRefused, "refused"}
	case e.endErr != nil || e.flushErr != nil:
		return endOutcome{endUnknown, "outcome-unknown"}
	case e.committed:
		return endOutcome{endCommitted, ""}
	case e.wantCommit && !e.shutdown && !e.revoked && e.commitErr == nil && !e.abortKnown():
		return endOutcome{endUnconfirmed, "outcome-unknown"}
	}
	reason := "rebalance"
	switch {
	case e.shutdown:
		reason = "shutdown"
	case e.failed:
		reason = "handler-error"
	case e.produceErr != nil:
		reason = "produce-error"
	case e.overBudget:
		reason = "budget"
	case e.commitErr != nil && !rebalancing(e.commitErr):
		reason = "commit-error"
	}
	switch {
	case e.shutdown:
		return endOutcome{endShutDown, reason}
	case e.wantCommit:
		return endOutcome{endRebalanced, reason}
	}
	return endOutcome{endBatchFailed, reason}
}

// knownOutcome is what the hanging-transaction check may take as the
// transaction's outcome: an abort when no commit was asked for, a commit
// when End confirmed one. A commit asked for that End did not confirm may
// have committed at the broker (see endUnconfirmed): unknown.
func (e txnEnd) knownOutcome() (committed, known bool) {
	switch {
	case !e.wantCommit:
		return false, true
	case e.committed:
		return true, true
	}
	return false, false
}

// A commit that End reported as not made may still have landed: franz-go
// retries a failed EndTxn (UNKNOWN_SERVER_ERROR, a lost connection) as an
// abort and returns (false, nil), which looks like a rebalance's abort.
// Going on in the same session would rewind to franz-go's view of the
// committed offsets and copy a committed batch again. The group's offsets,
// read from the broker, tell whether it was aborted.

// stableOffset is one partition's answer to a stable offset fetch: the
// committed offset (-1: none), or the error (UNSTABLE_OFFSET_COMMIT while
// a transaction's offset commit is pending).
type stableOffset struct {
	at  int64
	err error
}

// abortedBefore decides, from the group's stable offsets, whether a batch
// that consumed each partition of ends up to its end offset was aborted:
// every partition must be answered, without error, with an offset before
// its end. A partition missing from the answer, pending (markers on their
// way) or committed at its end leaves the outcome unknown.
func abortedBefore(ends map[topicPartition]int64, fetched map[topicPartition]stableOffset) bool {
	for tp, end := range ends {
		o, ok := fetched[tp]
		if !ok || o.err != nil || o.at >= end {
			return false
		}
	}
	return true
}

// knownAbort reports whether the batch b, whose commit End reported as not
// made, was indeed aborted (a group error, a failed heartbeat, a rebalance
// that took nothing from this member), so that the session may go on as
// after a rebalance. When the offsets show it committed, pending, or
// cannot be read, the outcome is unknown.
func (p *Processor) knownAbort(ctx context.Context, cl *kgo.Client, b *batch) bool {
	if len(b.ends) == 0 {
		return true // nothing consumed: nothing to commit
	}
	fetchCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	fetched, err := fetchStableOffsets(fetchCtx, cl, p.cfg.group, b.ends)
	if err != nil {
		p.logger.Debug("eos: reading the group's offsets after an unconfirmed commit failed", "err", err)
		return false
	}
	return abortedBefore(b.ends, fetched)
}

// fetchStableOffsets asks the group's coordinator for the offsets of the
// partitions of ends, stable only (RequireStable). The fetch names the
// partitions: asked for all of a group's offsets, Kafka lists only
// partitions with a committed offset, so a pending first commit would be
// missing rather than reported unstable.
func fetchStableOffsets(ctx context.Context, cl *kgo.Client, group string, ends map[topicPartition]int64) (map[topicPartition]stableOffset, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group, req.RequireStable = group, true
	index := map[string]int{}
	for tp := range ends {
		i, ok := index[tp.topic]
		if !ok {
			i = len(req.Topics)
			index[tp.topic] = i
			t := kmsg.NewOffsetFetchRequestTopic()
			t.Topic = tp.topic
			req.Topics = append(req.Topics, t)
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, tp.partition)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	fetched := map[topicPartition]stableOffset{}
	add := func(topic string, partition int32, at int64, code int16) {
		fetched[topicPartition{topic, partition}] = stableOffset{at, kerr.ErrorForCode(code)}
	}
	if len(resp.Groups) > 0 { // v8+
		g := resp.Groups[0]
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			return nil, err
		}
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				add(t.Topic, p.Partition, p.Offset, p.ErrorCode)
			}
		}
		return fetched, nil
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			add(t.Topic, p.Partition, p.Offset, p.ErrorCode)
		}
	}
	if len(fetched) == 0 {
		return nil, errors.New("the offset fetch answered no partition")
	}
	return fetched, nil
}

// rebalancing reports whether a plain batch's offset commit failed because
// the group moved on (a rebalance, the member or its generation gone).
func rebalancing(err error) bool {
	return errors.Is(err, kerr.RebalanceInProgress) || errors.Is(err, kerr.IllegalGeneration) ||
		errors.Is(err, kerr.UnknownMemberID) || errors.Is(err, kerr.StaleMemberEpoch) || errors.Is(err, kerr.FencedMemberEpoch)
}
