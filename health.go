package eoskit

import "time"

// Health is what a runner's Health method (an eos Processor's, an
// offsetstore Runner's, a dedup Consumer's, an outbox Relay's) returns for
// probes and dashboards: whether Run runs, the partitions assigned, the
// last commit, the last error ridden out, and the lag per partition as of
// its last poll. [Health.Healthy] and [Health.Ready] answer a liveness and
// a readiness probe. It marshals to JSON.
type Health struct {
	// Path is the runner's kind: "eos", "offsetstore", "dedup" or
	// "outbox".
	Path string `json:"path"`
	// Running is true while Run runs.
	Running bool `json:"running"`
	// Assigned holds the partitions the group gave this instance, and
	// LastAssigned when it last gave some. It starts empty with every
	// session.
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
	// Restoring holds the input partitions whose keyed state a stateful
	// eos processor is restoring from its changelog (eos.Changelog):
	// assigned, with their records waiting until the restore ends. The
	// runner is not Ready meanwhile.
	Restoring map[string][]int32 `json:"restoring,omitempty"`
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
	// returned. Its text is the log's: cut to 300 bytes, and quoting
	// what the error quotes (a handler's error may quote its record).
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
// it is Healthy, the group has given it its assignment in this session
// (Joined) or it is a relay standing by, and no partition's state is
// restoring (Restoring is empty: a state view would leave those
// partitions out, and an endpoint serving it would answer with partial
// totals). Healthy alone holds while a new session waits to be assigned
// anything, which after a restart lasts the session timeout of the
// member it replaces, and while state restores.
func (h Health) Ready() bool {
	return h.Healthy() && (h.Joined || h.Standby) && len(h.Restoring) == 0
}

// Worst returns the Health a probe should answer for several runners
// that work together (a grouped aggregation's two processors, say): the
// first of hs that is not healthy, else the first not ready, else the
// first. It returns the zero Health for none.
func Worst(hs ...Health) Health {
	for _, h := range hs {
		if !h.Healthy() {
			return h
		}
	}
	for _, h := range hs {
		if !h.Ready() {
			return h
		}
	}
	if len(hs) == 0 {
		return Health{}
	}
	return hs[0]
}
