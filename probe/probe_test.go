package probe_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/probe"
)

// Each probe answers from the Health of the moment: 200 when its
// predicate holds, 503 when not, with the Health as JSON either way.
func TestProbesAnswerFromTheHealthOfTheMoment(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name                            string
		health                          eoskit.Health
		wantLive, wantHealth, wantReady int
	}{
		{"stopped", eoskit.Health{Path: "eos"}, 503, 503, 503},
		{"running, waiting for its assignment", eoskit.Health{Path: "eos", Running: true}, 200, 200, 503},
		{"running and assigned", eoskit.Health{Path: "eos", Running: true, Joined: true, LastAssigned: now}, 200, 200, 200},
		{"riding out an outage", eoskit.Health{Path: "offsetstore", Running: true, Joined: true, LastAssigned: now.Add(-time.Minute),
			LastRecords: now.Add(-time.Second), LastError: "database: connection refused", LastErrorAt: now}, 200, 503, 503},
		{"a relay standing by", eoskit.Health{Path: "outbox", Running: true, Standby: true}, 200, 200, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			probe.Routes(mux, func() eoskit.Health { return tc.health })
			for path, want := range map[string]int{"/livez": tc.wantLive, "/healthz": tc.wantHealth, "/readyz": tc.wantReady} {
				rec := httptest.NewRecorder()
				mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != want {
					t.Errorf("%s: %d, want %d", path, rec.Code, want)
				}
				var got eoskit.Health
				if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Path != tc.health.Path || got.LastError != tc.health.LastError {
					t.Errorf("%s: body %q (%v), want the Health as JSON", path, rec.Body, err)
				}
			}
		})
	}
}

// Start reports a port taken at once, as a configuration error of the
// program's start; and the server stops when its context ends.
func TestStartReportsATakenPortAndStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mux := http.NewServeMux()
	probe.Routes(mux, func() eoskit.Health { return eoskit.Health{Running: true} })
	srv, err := probe.Start(ctx, "127.0.0.1:0", mux)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := probe.Start(ctx, srv.Addr().String(), mux); err == nil || !strings.Contains(err.Error(), srv.Addr().String()) {
		t.Fatalf("a second server on %s: %v, want an error naming the address", srv.Addr(), err)
	}
	resp, err := http.Get("http://" + srv.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
	cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(probe.ShutdownTimeout + 5*time.Second):
		t.Fatal("the server did not stop after its context ended")
	}
	if _, err := http.Get("http://" + srv.Addr().String() + "/healthz"); err == nil {
		t.Fatal("the server still answers after Wait returned")
	}
}

// Serve listens before the runner starts (an address taken is refused and
// the runner never runs), and returns the runner's error once it stops.
func TestServeListensFirstAndReturnsTheRunnersError(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mux := http.NewServeMux()
	probe.Routes(mux, func() eoskit.Health { return eoskit.Health{Running: true} })
	taken, err := probe.Start(ctx, "127.0.0.1:0", mux)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := probe.Serve(ctx, taken.Addr().String(), mux, func(context.Context) error { ran = true; return nil }); err == nil || ran {
		t.Fatalf("Serve on a taken address: %v, runner ran: %v; want an error and no run", err, ran)
	}
	stopped := errors.New("the runner's error")
	for _, addr := range []string{"127.0.0.1:0", ""} {
		if err := probe.Serve(ctx, addr, mux, func(context.Context) error { return stopped }); !errors.Is(err, stopped) {
			t.Fatalf("Serve on %q returned %v, want the runner's error", addr, err)
		}
	}
}

// Serve answers while the runner drains after ctx ended, and stops only
// when the runner returns: a probe during a drain of DrainTimeout finds
// the server, not a refused connection.
func TestServeAnswersWhileTheRunnerDrains(t *testing.T) {
	mux := http.NewServeMux()
	probe.Routes(mux, func() eoskit.Health { return eoskit.Health{Running: true} })
	// A port free a moment ago: a server's, stopped.
	tmpCtx, tmpCancel := context.WithCancel(context.Background())
	tmp, err := probe.Start(tmpCtx, "127.0.0.1:0", mux)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + tmp.Addr().String() + "/livez"
	tmpCancel()
	if err := tmp.Wait(); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	during := 0
	err = probe.Serve(ctx, tmp.Addr().String(), mux, func(ctx context.Context) error {
		cancel() // the program's SIGTERM; the runner drains
		<-ctx.Done()
		resp, err := client.Get(url)
		if err != nil {
			return err
		}
		during = resp.StatusCode
		return resp.Body.Close()
	})
	if err != nil || during != http.StatusOK {
		t.Fatalf("while the runner drained: %d, %v; want 200 from /livez", during, err)
	}
	if resp, err := client.Get(url); err == nil {
		_ = resp.Body.Close()
		t.Fatal("the server still answers after the runner returned")
	}
}
