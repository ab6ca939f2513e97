package loop

import (
	"context"
	"time"
)

// Drained returns the context a runner works under once Run's ctx ends,
// for its drain: it ends drain after ctx does (with ctx when drain is 0),
// or when done is called. Polling stops with ctx; handlers, producing and
// committing go on under work.
func Drained(ctx context.Context, drain time.Duration) (work context.Context, done func()) {
	if drain <= 0 {
		return ctx, func() {}
	}
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	returned := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-returned:
			return
		}
		t := time.NewTimer(drain)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-returned:
		}
	}()
	return work, func() { close(returned); cancel() }
}
