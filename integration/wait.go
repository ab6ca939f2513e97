package integration

import (
	"context"
	"testing"
	"time"
)

// WaitFor calls done every 100 ms until it returns true, and fails the
// test, naming what it waited for and done's last error, once timeout has
// passed first. An error from done is not final: it is retried (a pool's
// connections fail once each after a database restart, say). A done that
// blocks holds the wait past its timeout: give it a bounded context, as
// [WaitForCtx] does.
func WaitFor(tb testing.TB, timeout time.Duration, what string, done func() (bool, error)) {
	tb.Helper()
	WaitForCtx(tb, timeout, what, func(context.Context) (bool, error) { return done() })
}

// WaitForCtx is [WaitFor] with done given a context that ends at the
// timeout, so that a check that blocks (a query, a request) ends with it.
func WaitForCtx(tb testing.TB, timeout time.Duration, what string, done func(ctx context.Context) (bool, error)) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := done(ctx)
		if ok && err == nil {
			return
		}
		if time.Now().After(deadline) {
			if err != nil {
				tb.Fatalf("integration: waited %v for %s; the last check failed: %v", timeout, what, err)
			}
			tb.Fatalf("integration: waited %v for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
