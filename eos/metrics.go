package eos

import (
	"time"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/changelog"
)

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

// RestoreMetrics is implemented by an [eoskit.Metrics] that also observes
// the restores of keyed state (eosprom's does): one call per changelog
// partition restored (at each assignment, and after a session restart),
// with the offset the restore read from (the store's checkpoint; the
// log's start when the store had none or was wiped), the records it
// applied and how long it took. It is called before the partition
// becomes readable (the views, Health): whoever sees a partition ready
// finds its restore reported. Do not wait there for the partition to be
// ready: it becomes so once the call returns. A restore that failed or
// was cancelled (a revoke or a new assignment while it ran in the
// background, the session's end) is not reported; one cancelled just as
// it was reported stays unready, and its next restore is reported again.
type RestoreMetrics interface {
	Restored(topic string, partition int32, from int64, records int, took time.Duration)
}

// restored reports a restore of the changelog's partition, when the
// metrics take it.
func (p *Processor) restored(partition int32, r changelog.Result) {
	if rm, ok := p.obs.Metrics.(RestoreMetrics); ok {
		rm.Restored(p.cfg.state.changelog, partition, r.From, r.Records, r.Took)
	}
}

// lateRecord counts a late record of a windowed aggregation, when the
// processor's metrics count them.
func (p *Processor) lateRecord() {
	if lm, ok := p.obs.Metrics.(LateMetrics); ok {
		lm.LateRecord()
	}
}
