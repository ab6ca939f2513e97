package eoskit

import "time"

// Metrics receives what a runner does: an eos Processor, an offsetstore
// Runner, a dedup Consumer and an outbox Relay all report through this one
// interface (each runner's WithMetrics), and eos/eosprom implements it for
// Prometheus, labelled by path. Implementations must be safe for
// concurrent use and fast: they are called on the processing path. Embed
// [NopMetrics] to implement only some of it.
type Metrics interface {
	// Committed: a transaction (a batch, under the weaker semantics or in
	// a database) committed: the input records it consumed, the output
	// records it wrote (0 for the database paths), how long it was open.
	Committed(recordsIn, recordsOut int, d time.Duration)
	// Aborted: a transaction was aborted (rolled back), with why:
	// "rebalance", "handler-error", "produce-error", "shutdown",
	// "outcome-unknown", "budget" (handlers ran out of the transaction's
	// budget), "timeout", "fenced", "refused", "commit-error" (a batch's
	// offset commit under the weaker semantics failed, not for a
	// rebalance); the database paths:
	// "handler-error", "database-error", "stale" (another owner moved the
	// offsets), "record-error" (dedup: a record without a usable id).
	Aborted(reason string, d time.Duration)
	// Rebalanced: the group took partitions from this member (revoked or
	// lost).
	Rebalanced()
	// Fenced: a newer instance with the same transactional id fenced this
	// one.
	Fenced()
	// HandlerStarted and Handled: a handler call began, and ended after d
	// (failed: it returned an error or panicked); the difference is the
	// records in flight.
	HandlerStarted()
	Handled(d time.Duration, failed bool)
	// DeadLettered: n records were dead-lettered, in work that committed.
	DeadLettered(n int)
	// Lag: after a poll, the offsets that stood after the last record
	// polled, up to the high watermark; -1 once the partition is no
	// longer this runner's (revoked or lost), to forget it.
	Lag(topic string, partition int32, lag int64)
}

// NopMetrics ignores everything it receives. Embed it in a [Metrics] that
// implements only some of the methods.
type NopMetrics struct{}

func (NopMetrics) Committed(int, int, time.Duration) {}
func (NopMetrics) Aborted(string, time.Duration)     {}
func (NopMetrics) Rebalanced()                       {}
func (NopMetrics) Fenced()                           {}
func (NopMetrics) HandlerStarted()                   {}
func (NopMetrics) Handled(time.Duration, bool)       {}
func (NopMetrics) DeadLettered(int)                  {}
func (NopMetrics) Lag(string, int32, int64)          {}

// PathMetrics is implemented by a [Metrics] that labels what it receives
// by the path of the runner that reports it and its consumer group: each
// runner given one calls
// ForPath once, with "eos", "offsetstore", "dedup" or "outbox" and its
// group (empty for the outbox), and reports to what it returns. eosprom's
// Metrics is one; it labels lag by group too, so that runners of one path
// in different groups reading the same topic do not overwrite each other's.
type PathMetrics interface {
	ForPath(path, group string) Metrics
}
