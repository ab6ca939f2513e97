package eos

import "time"

// Metrics receives what a [Processor] does. Implementations must be safe for
// concurrent use (several processors may share one) and fast: they are
// called on the processing path. eosprom.New gives a Prometheus one.
type Metrics interface {
	// Committed is called after a transaction (or, under the weaker
	// semantics, a batch) committed: how many input records it consumed,
	// how many output records it wrote, and how long it was open.
	Committed(recordsIn, recordsOut int, d time.Duration)
	// Aborted is called after a transaction was aborted, with why:
	// "rebalance", "handler-error", "produce-error", "shutdown",
	// "outcome-unknown", "budget" (handlers ran out of the transaction's
	// budget, so it ended early; also when a record too slow for any
	// transaction is dead-lettered in the next), "timeout" (the
	// transaction outlived its timeout) or "fenced".
	Aborted(reason string, d time.Duration)
	// Rebalanced is called when the group takes partitions from this
	// member (revoked or lost).
	Rebalanced()
	// Fenced is called when a newer instance with the same transactional
	// id fenced this one.
	Fenced()
}

type nopMetrics struct{}

func (nopMetrics) Committed(int, int, time.Duration) {}
func (nopMetrics) Aborted(string, time.Duration)     {}
func (nopMetrics) Rebalanced()                       {}
func (nopMetrics) Fenced()                           {}

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
