package eos

import "github.com/eoskit/eoskit"

// HangingMetrics is implemented by an [eoskit.Metrics] that also counts the hanging
// transactions a [Processor] found (eosprom's does). outcome is
// "committed", "aborted" or "unknown".
type HangingMetrics interface {
	HangingTransaction(outcome string)
}

// hangMetrics calls m's HangingTransaction when it has one.
type hangMetrics struct{ m eoskit.Metrics }

func (h hangMetrics) hanging(outcome string) {
	if hm, ok := h.m.(HangingMetrics); ok {
		hm.HangingTransaction(outcome)
	}
}
