package leastprivilege_test

import (
	"context"
	"testing"
	"time"
)

// runUntil runs run until done reports the work complete (then stops it
// and returns what it returned), or until it returns by itself (its
// error). Neither within 90 s is a stall: it fails t with stalled(), which
// names the runner and what it was waiting for.
func runUntil(ctx context.Context, t *testing.T, run func(context.Context) error, done func() bool, stalled func() string) error {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	finished := make(chan error, 1)
	go func() { finished <- run(runCtx) }()
	deadline := time.After(90 * time.Second)
	for {
		select {
		case err := <-finished:
			return err
		case <-deadline:
			cancel()
			select {
			case <-finished:
			case <-time.After(30 * time.Second):
				t.Errorf("and Run did not return within 30 s of its context's end")
			}
			t.Fatalf("stalled: in 90 s %s", stalled())
		case <-time.After(500 * time.Millisecond):
			if done() {
				cancel()
				select {
				case err := <-finished:
					return err
				case <-time.After(30 * time.Second):
					t.Fatalf("done, but Run did not return within 30 s of its context's end")
				}
			}
		}
	}
}
