package eos

import "github.com/eoskit/eoskit/internal/loop"

// Metrics receives what a runner does: an eos [Processor], an
// offsetstore.Runner and a dedup.Consumer all report through this one
// interface (each runner's WithMetrics), and eosprom implements it for
// Prometheus, labelled by path. Implementations must be safe for
// concurrent use and fast: they are called on the processing path. Embed
// [NopMetrics] to implement only some of it. The methods:
//
//	Committed(recordsIn, recordsOut int, d time.Duration)
//	    a transaction (a batch, under the weaker semantics or in a
//	    database) committed: the input records it consumed, the output
//	    records it wrote (0 for the database paths), how long it was open.
//	Aborted(reason string, d time.Duration)
//	    a transaction was aborted (rolled back), with why: "rebalance",
//	    "handler-error", "produce-error", "shutdown", "outcome-unknown",
//	    "budget" (handlers ran out of the transaction's budget), "timeout",
//	    "fenced", "refused"; the database paths: "handler-error",
//	    "database-error", "stale" (another owner moved the offsets),
//	    "record-error" (dedup: a record without a usable id).
//	Rebalanced()
//	    the group took partitions from this member (revoked or lost).
//	Fenced()
//	    a newer instance with the same transactional id fenced this one.
//	HandlerStarted(), Handled(d time.Duration, failed bool)
//	    a handler call began, and ended after d (failed: it returned an
//	    error or panicked); the difference is the records in flight.
//	DeadLettered(n int)
//	    n records were dead-lettered, in work that committed.
//	Lag(topic string, partition int32, lag int64)
//	    after a poll: the offsets that stood after the last record polled,
//	    up to the high watermark; -1 once the partition is no longer this
//	    runner's (revoked or lost), to forget it.
type Metrics = loop.Metrics

// NopMetrics ignores everything it receives. Embed it in a [Metrics] that
// implements only some of the methods.
type NopMetrics = loop.NopMetrics

// PathMetrics is a [Metrics] that labels what it receives by the path of
// the runner that reports it and its consumer group: each runner calls
// ForPath once, with "eos", "offsetstore", "dedup" or "outbox" and its
// group (empty for the outbox), and reports to what it returns. eosprom's
// Metrics is one; it labels lag by group too, so that runners of one path
// in different groups reading the same topic do not overwrite each other's.
type PathMetrics = loop.PathMetrics

// Health is what [Processor.Health] (and offsetstore's, dedup's and the
// outbox relay's Health) returns for probes and dashboards: whether Run
// runs, the partitions assigned, the last commit, the last error ridden
// out, and the lag per partition as of its last poll. Healthy is true
// while Run runs and has made progress since its last error (see
// Health.Healthy). It marshals to JSON.
type Health = loop.Health

// HangingMetrics is implemented by a [Metrics] that also counts the hanging
// transactions a [Processor] found (eosprom's does). outcome is
// "committed", "aborted" or "unknown".
type HangingMetrics interface {
	HangingTransaction(outcome string)
}

// hangMetrics calls m's HangingTransaction when it has one.
type hangMetrics struct{ m Metrics }

func (h hangMetrics) hanging(outcome string) {
	if hm, ok := h.m.(HangingMetrics); ok {
		hm.HangingTransaction(outcome)
	}
}
