package loop

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

// Observer is what a runner reports to: its metrics, and the state behind
// its Health. Safe for concurrent use.
type Observer struct {
	Metrics eoskit.Metrics
	mu      sync.Mutex
	h       eoskit.Health
	idle    idleWatch
	// origin is when the observer was made: HandleTimed times each call
	// as time.Since(origin), a read of the monotonic clock, where
	// time.Now reads the wall clock too (30 ns a record here, twice the
	// monotonic read). NewObserver sets it: the zero time would make
	// every duration saturate, and each call measure 0.
	origin time.Time
	// timesCalls is whether Metrics receives handler times (anything but
	// NopMetrics): else a call that succeeds reads the clock once, not
	// twice (a read is some 40 ns on the 2-core machine, 2-3% of a
	// windowed count's CPU a record).
	timesCalls bool
}

// NewObserver returns the observer of a runner of path in group reporting
// to m (nil: nowhere), labelled by path and group when m is an eoskit.PathMetrics.
func NewObserver(path, group string, m eoskit.Metrics) *Observer {
	switch pm := m.(type) {
	case nil:
		m = eoskit.NopMetrics{}
	case eoskit.PathMetrics:
		m = pm.ForPath(path, group)
	case interface{ ForPath(string) eoskit.Metrics }:
		// The earlier shape, without the group: still labelled by path
		// rather than silently not at all.
		m = pm.ForPath(path)
	}
	_, nop := m.(eoskit.NopMetrics)
	return &Observer{Metrics: m, h: eoskit.Health{Path: path}, origin: time.Now(), timesCalls: !nop}
}

// Running notes that Run started (true) or returned (false, with err).
func (o *Observer) Running(running bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.h.Running = running
	o.reset()
	o.idle.forget()
	if err != nil {
		o.h.LastError, o.h.LastErrorAt = ErrorText(err), time.Now()
	}
}

// NewSession notes that a new session (a new client, joining the group
// afresh) starts: what the last one was assigned is forgotten.
func (o *Observer) NewSession() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.reset()
	o.idle.forget()
}

// reset forgets the assignment and the lag (their series too). o.mu is
// held.
func (o *Observer) reset() {
	for t, parts := range o.h.Lag {
		for p := range parts {
			o.Metrics.Lag(t, p, -1)
		}
	}
	o.h.Assigned, o.h.Lag, o.h.Joined = nil, nil, false
}

// Committed notes committed work.
func (o *Observer) Committed(in, out int, d time.Duration) {
	o.Metrics.Committed(in, out, d)
	o.mu.Lock()
	o.h.LastCommit = time.Now()
	o.mu.Unlock()
}

// Aborted notes work rolled back, and why.
func (o *Observer) Aborted(reason string, d time.Duration) { o.Metrics.Aborted(reason, d) }

// Fenced notes that a newer instance fenced this one.
func (o *Observer) Fenced() { o.Metrics.Fenced() }

// DeadLettered notes n records dead-lettered (committed).
func (o *Observer) DeadLettered(n int) {
	if n > 0 {
		o.Metrics.DeadLettered(n)
	}
}

// Failed notes a failure the runner rides out.
func (o *Observer) Failed(err error) {
	if err == nil {
		return
	}
	o.mu.Lock()
	o.h.LastError, o.h.LastErrorAt = ErrorText(err), time.Now()
	o.mu.Unlock()
}

// Assigned notes partitions the group gave.
func (o *Observer) Assigned(parts map[string][]int32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.h.LastAssigned, o.h.Joined = time.Now(), true
	if len(parts) > 0 {
		o.idle.stop()
	}
	if o.h.Assigned == nil {
		o.h.Assigned = map[string][]int32{}
	}
	for t, ps := range parts {
		merged := append(slices.Clone(o.h.Assigned[t]), ps...)
		slices.Sort(merged)
		o.h.Assigned[t] = slices.Compact(merged)
	}
}

// Revoked notes partitions the group took (revoked or lost).
func (o *Observer) Revoked(parts map[string][]int32) {
	if len(parts) == 0 {
		return // the end of a cooperative session: nothing taken, no rebalance of this runner's
	}
	o.Metrics.Rebalanced()
	o.mu.Lock()
	defer o.mu.Unlock()
	for t, ps := range parts {
		o.h.Assigned[t] = slices.DeleteFunc(o.h.Assigned[t], func(p int32) bool { return slices.Contains(ps, p) })
		if len(o.h.Assigned[t]) == 0 {
			delete(o.h.Assigned, t)
		}
		for _, p := range ps {
			if _, ok := o.h.Lag[t][p]; ok {
				o.Metrics.Lag(t, p, -1) // no longer this runner's to report
			}
			delete(o.h.Lag[t], p)
		}
		if len(o.h.Lag[t]) == 0 {
			delete(o.h.Lag, t)
		}
	}
	if len(o.h.Assigned) == 0 {
		o.idle.arm(o)
	}
}

// Lost notes partitions lost with the group session (it expired: the
// runner is out of the group until it rejoins, so not Ready).
func (o *Observer) Lost(parts map[string][]int32) {
	o.Revoked(parts)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.h.Joined = false
}

// StandingBy notes that a relay stands by behind a live one (true), or
// has taken its slot (false).
func (o *Observer) StandingBy(standby bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.h.Standby = standby
}

// Read notes that a runner without polls (a relay) read records to
// publish.
func (o *Observer) Read() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.h.LastRecords = time.Now()
}

// Fetched notes the lag of each partition a poll returned records of: the
// high watermark less the offset after its last record. A partition no
// longer assigned (revoked between the poll and now) is left out.
func (o *Observer) Fetched(fetches kgo.Fetches) {
	if fetches.NumRecords() > 0 {
		o.mu.Lock()
		o.h.LastRecords = time.Now()
		o.mu.Unlock()
	}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		lag := max(0, p.HighWatermark-(p.Records[len(p.Records)-1].Offset+1))
		o.mu.Lock()
		defer o.mu.Unlock()
		if !slices.Contains(o.h.Assigned[p.Topic], p.Partition) {
			return
		}
		o.Metrics.Lag(p.Topic, p.Partition, lag)
		if o.h.Lag == nil {
			o.h.Lag = map[string]map[int32]int64{}
		}
		if o.h.Lag[p.Topic] == nil {
			o.h.Lag[p.Topic] = map[int32]int64{}
		}
		o.h.Lag[p.Topic][p.Partition] = lag
	})
}

// Handle runs a user's handler call, timing it for the metrics and turning
// a panic into an error (see [Recover]).
func (o *Observer) Handle(pkg string, call func() error) error {
	_, err := o.HandleTimed(pkg, call)
	return err
}

// HandleTimed is Handle, and returns how long a call that failed took
// (0 for one that succeeded): a caller that weighs a failure by its time
// (eos's budget) reads the clock once with the metrics. A call that
// succeeds reads it once when nothing receives handler times.
func (o *Observer) HandleTimed(pkg string, call func() error) (failedAfter time.Duration, err error) {
	o.Metrics.HandlerStarted()
	start := time.Since(o.origin)
	if err = Recover(pkg, call); err == nil && !o.timesCalls {
		return 0, nil
	}
	took := time.Since(o.origin) - start
	o.Metrics.Handled(took, err != nil)
	if err != nil {
		failedAfter = took
	}
	return failedAfter, err
}

// Health returns a copy of the runner's health.
func (o *Observer) Health() eoskit.Health {
	o.mu.Lock()
	defer o.mu.Unlock()
	h := o.h
	h.Assigned = maps.Clone(h.Assigned)
	for t, ps := range h.Assigned {
		h.Assigned[t] = slices.Clone(ps)
	}
	h.Lag = maps.Clone(h.Lag)
	for t, l := range h.Lag {
		h.Lag[t] = maps.Clone(l)
	}
	return h
}
