// Package httpcheck holds what the tests of the patterns' programs use to
// run them and look at the probes and metrics they serve.
package httpcheck

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/eoskit/eoskit/testsupport/freeport"
)

// Get returns the status and body of url, or 0 and the error's text if it
// does not answer within 5 s.
func Get(url string) (int, string) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err.Error()
	}
	return resp.StatusCode, string(body)
}

// FreeAddr returns a loopback address whose port was free a moment ago,
// for a program's -http.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	ports, err := freeport.Ports(1)
	if err != nil {
		tb.Fatalf("httpcheck: %v", err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0])
}

// Background runs run in a goroutine until the test ends, or until stop
// is called: it then cancels run's context and fails the test unless run
// returns nil within a minute. stop may be called more than once.
func Background(tb testing.TB, run func(context.Context) error) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("run: %v", err)
				}
			case <-time.After(time.Minute):
				tb.Error("run did not return within a minute of its context's end")
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
