package eos

import "github.com/eoskit/eoskit/internal/loop"

// idleWake ends an idle poll early when the group's callbacks leave the
// loop something to do between transactions: partitions to restore (a
// stateful processor's assignment), or a revoke after which franz-go's
// GroupTransactSession must be re-armed (see session.rearm). A wake that
// comes while no poll waits is kept for the next one; a spare wake costs
// one empty poll.
type idleWake struct{ ch chan struct{} }

func newIdleWake() *idleWake { return &idleWake{ch: make(chan struct{}, 1)} }

// signal wakes the poll under way, or the next one.
func (w *idleWake) signal() {
	select {
	case w.ch <- struct{}{}:
	default: // a wake is pending already
	}
}

// waking returns poll ending early (with no records) on a signal.
func (w *idleWake) waking(poll pollFunc) pollFunc { return loop.Interruptible(poll, w.ch) }

// pollFunc is a session's poll.
type pollFunc = loop.PollFunc
