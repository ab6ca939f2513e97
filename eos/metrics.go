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
	// budget; ended early), "timeout" (the transaction outlived its
	// timeout) or "fenced".
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
