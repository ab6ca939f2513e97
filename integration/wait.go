package integration

import (
	"testing"
	"time"
)

// WaitFor calls done every 100 ms until it returns true, and fails the
// test, naming what it waited for and done's last error, once timeout has
// passed first. An error from done is not final: it is retried (a pool's
// connections fail once each after a database restart, say).
func WaitFor(tb testing.TB, timeout time.Duration, what string, done func() (bool, error)) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := done()
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
