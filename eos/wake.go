package eos

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

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
func (w *idleWake) waking(poll pollFunc) pollFunc { return interruptible(poll, w.ch) }

// pollFunc is a session's poll.
type pollFunc = func(ctx context.Context, maxRecords int) kgo.Fetches

// interruptible returns poll ending early (with no records) when wake, a
// channel of one slot that its senders fill without blocking, receives. A
// wake taken as the poll returns is put back for the next poll (a spare
// one costs an empty poll); one taken in the instant between the poll's
// return and its context's end is dropped, which the loop, going round
// anyway, does not miss: a wake carries no state.
func interruptible(poll pollFunc, wake chan struct{}) pollFunc {
	return func(ctx context.Context, n int) kgo.Fetches {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-wake:
				if ctx.Err() != nil { // the poll returned meanwhile
					select {
					case wake <- struct{}{}:
					default: // another came meanwhile
					}
				}
				cancel()
			case <-ctx.Done():
			}
		}()
		return poll(ctx, n)
	}
}
