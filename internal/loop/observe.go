package loop

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Metrics receives what a runner does. eos.Metrics documents it for users;
// every runner reports through the same interface, so one implementation
// (eosprom's) serves them all.
type Metrics interface {
	Committed(recordsIn, recordsOut int, d time.Duration)
	Aborted(reason string, d time.Duration)
	Rebalanced()
	Fenced()
	HandlerStarted()
	Handled(d time.Duration, failed bool)
	DeadLettered(n int)
	Lag(topic string, partition int32, lag int64)
}

// PathMetrics is a Metrics that labels what it receives with the path of
// the runner reporting it ("eos", "offsetstore", "dedup", "outbox") and its
// consumer group (empty for the outbox): each runner asks it, once, for
// the Metrics of its path and group.
type PathMetrics interface {
	ForPath(path, group string) Metrics
}

// NopMetrics ignores everything; embed it to implement only some methods.
type NopMetrics struct{}

func (NopMetrics) Committed(int, int, time.Duration) {}
func (NopMetrics) Aborted(string, time.Duration)     {}
func (NopMetrics) Rebalanced()                       {}
func (NopMetrics) Fenced()                           {}
func (NopMetrics) HandlerStarted()                   {}
func (NopMetrics) Handled(time.Duration, bool)       {}
func (NopMetrics) DeadLettered(int)                  {}
func (NopMetrics) Lag(string, int32, int64)          {}

// Health is what a runner shows probes and dashboards.
type Health struct {
	// Path is the runner's kind: "eos", "offsetstore", "dedup" or
	// "outbox".
	Path string `json:"path"`
	// Running is true while Run runs.
	Running bool `json:"running"`
	// Assigned holds the partitions the group gave this instance, and
	// LastAssigned when it last gave some. It starts empty with every
	// session. (franz-go's GroupTransactSession drops a revocation that
	// comes while an earlier one waits for the next transaction to end, so
	// an idle eos processor may list a partition it lost until its next
	// transaction or session.)
	// An outbox relay has no partitions: its LastAssigned is when it last
	// took its replication slot.
	Assigned     map[string][]int32 `json:"assigned"`
	LastAssigned time.Time          `json:"last_assigned"`
	// Joined is true once the group has given this instance its
	// assignment in the current session (partitions, or none when the
	// group has more members than partitions), and false from the start
	// of a session until then. A member that restarts without static
	// membership waits there while the group waits out the session
	// timeout of the member it replaces (45 s by default): see [Health.Ready].
	// An outbox relay has joined once it holds its slot.
	Joined bool `json:"joined"`
	// Standby is true while an outbox relay stands by behind another
	// relay that holds its slot: healthy, with nothing to do.
	Standby bool `json:"standby,omitempty"`
	// LastRecords is when a poll last returned records (a relay: when it
	// last read a transaction to publish).
	LastRecords time.Time `json:"last_records"`
	// LastCommit is when work was last committed (zero: not yet).
	LastCommit time.Time `json:"last_commit"`
	// LastError is the last failure the runner met and is riding out (a
	// session restart, a database retry), and when; or the error Run
	// returned.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at"`
	// Lag is, per assigned partition, how many offsets stood after the
	// last record polled, up to the high watermark, as of that poll (a
	// poll that returns nothing for a partition leaves it as it was). It
	// counts offsets, not records: on a topic written in transactions,
	// the markers and aborted records after the last committed record
	// count too, so a partition that is caught up can show a small lag;
	// and it grows while a hanging transaction holds read_committed
	// readers back.
	Lag map[string]map[int32]int64 `json:"lag"`
}

// Healthy reports whether the runner is running and has made progress
// since its last error (or met none): it committed, or its group gave it
// partitions and it has polled no records since (a new session after a
// restart, on a topic with nothing to read; one that polls records and
// never commits them is not healthy), or it is a relay standing by.
func (h Health) Healthy() bool {
	if !h.Running {
		return false
	}
	return h.LastError == "" || h.Standby || h.LastCommit.After(h.LastErrorAt) ||
		h.LastAssigned.After(h.LastErrorAt) && !h.LastRecords.After(h.LastAssigned)
}

// Ready reports whether a readiness probe should send the runner work:
// it is Healthy, and the group has given it its assignment in this
// session (Joined) or it is a relay standing by. Healthy alone holds
// while a new session waits to be assigned anything, which after a
// restart lasts the session timeout of the member it replaces.
func (h Health) Ready() bool {
	return h.Healthy() && (h.Joined || h.Standby)
}

// Observer is what a runner reports to: its metrics, and the state behind
// its Health. Safe for concurrent use.
type Observer struct {
	Metrics Metrics
	mu      sync.Mutex
	h       Health
	idle    idleWatch
}

// NewObserver returns the observer of a runner of path in group reporting
// to m (nil: nowhere), labelled by path and group when m is a PathMetrics.
func NewObserver(path, group string, m Metrics) *Observer {
	switch pm := m.(type) {
	case nil:
		m = NopMetrics{}
	case PathMetrics:
		m = pm.ForPath(path, group)
	case interface{ ForPath(string) Metrics }:
		// The earlier shape, without the group: still labelled by path
		// rather than silently not at all.
		m = pm.ForPath(path)
	}
	return &Observer{Metrics: m, h: Health{Path: path}}
}

// Running notes that Run started (true) or returned (false, with err).
func (o *Observer) Running(running bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.h.Running = running
	o.reset()
	o.idle.forget()
	if err != nil {
		o.h.LastError, o.h.LastErrorAt = err.Error(), time.Now()
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
	o.h.LastError, o.h.LastErrorAt = err.Error(), time.Now()
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

// HandleTimed is Handle, and returns how long the call took: a caller
// that needs the time too reads the clock once for both.
func (o *Observer) HandleTimed(pkg string, call func() error) (time.Duration, error) {
	o.Metrics.HandlerStarted()
	start := time.Now()
	err := Recover(pkg, call)
	took := time.Since(start)
	o.Metrics.Handled(took, err != nil)
	return took, err
}

// Health returns a copy of the runner's health.
func (o *Observer) Health() Health {
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
