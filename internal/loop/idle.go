package loop

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// IdleAfter is how long a member of a group may go without a partition
// before its runner says so: the session timeout, plus a quarter of it
// and at least 5 s more for the rebalance that follows. A member that
// left without leaving the group (killed, or cut off) holds its
// partitions until its session timeout expires; a wait longer than that
// has another cause.
func IdleAfter(session time.Duration) time.Duration {
	return session + max(5*time.Second, session/4)
}

// SessionTimeout is how long a healthy group may take to assign cl's
// member: its session timeout (a member that left without leaving holds
// its partitions that long; franz-go's default 45 s) or its rebalance
// timeout (a member slow to rejoin holds the rebalance that long; default
// 60 s), whichever is longer.
func SessionTimeout(cl *kgo.Client) time.Duration {
	session, _ := cl.OptValue(kgo.SessionTimeout).(time.Duration)
	rebalance, _ := cl.OptValue(kgo.RebalanceTimeout).(time.Duration)
	return max(session, rebalance)
}

// WatchAssignment makes o log one Warn line on logger when its runner,
// from now (a new session joining its group) or from when the group took
// its last partition, holds no partition for [IdleAfter] the session
// timeout: the group assigned it nothing, and the line says the likely
// reasons. It logs once per such wait; a partition assigned ends the
// wait, as do Running(false) and NewSession.
func (o *Observer) WatchAssignment(logger *slog.Logger, session time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.idle.stop()
	o.idle.logger, o.idle.session = logger, session
	o.idle.arm(o)
}

// idleWatch is the timer behind WatchAssignment; o.mu guards it.
type idleWatch struct {
	logger  *slog.Logger // nil: not watching
	session time.Duration
	timer   *time.Timer
	gen     int // a timer of an earlier generation fired too late: it logs nothing
}

// arm starts the wait unless o holds partitions or one is under way.
func (w *idleWatch) arm(o *Observer) {
	if w.logger == nil || w.timer != nil || len(o.h.Assigned) > 0 {
		return
	}
	w.gen++
	gen, after := w.gen, IdleAfter(w.session)
	w.timer = time.AfterFunc(after, func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if gen != w.gen || len(o.h.Assigned) > 0 {
			return
		}
		w.timer = nil
		w.logger.Warn(o.h.Path+": the group has assigned this member no partition for "+after.String()+
			": another member may hold them until its session timeout expires (a member stopped without leaving the group, killed say, holds them that long), "+
			"a member may be slow to rejoin a rebalance (up to its rebalance timeout), the group's coordinator may be unreachable, "+
			"or the group has more members than its topics have partitions",
			"waited", after, "session_or_rebalance_timeout", w.session)
	})
}

// forget ends the watch (Running, NewSession): nothing is logged until
// WatchAssignment is called again.
func (w *idleWatch) forget() {
	w.stop()
	w.logger = nil
}

// stop ends the wait, if one is under way.
func (w *idleWatch) stop() {
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.gen++
}
