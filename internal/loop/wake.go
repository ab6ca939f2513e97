package loop

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// PollFunc is a runner's poll.
type PollFunc = func(ctx context.Context, maxRecords int) kgo.Fetches

// Interruptible returns poll ending early (with no records) when wake, a
// channel of one slot that its senders fill without blocking, receives. A
// wake taken as the poll returns is put back for the next poll (a spare
// one costs an empty poll); one taken in the instant between the poll's
// return and its context's end is dropped, which the loop, going round
// anyway, does not miss: a wake carries no state.
func Interruptible(poll PollFunc, wake chan struct{}) PollFunc {
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
