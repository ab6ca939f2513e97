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

// lateRecord counts a late record of a windowed aggregation, when the
// processor's metrics count them.
func (p *Processor) lateRecord() {
	if lm, ok := p.obs.Metrics.(LateMetrics); ok {
		lm.LateRecord()
	}
}
