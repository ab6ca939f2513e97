package eoshttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eoshttp"
)

// Two instances keeping a standby of each other's partitions
// (eos.Standbys(1)). Asked for a key of the other's partition, an
// instance answers 421 without Stale; with Stale, the value its standby
// holds (the true count: nothing was produced since), marked with
// Eoskit-Stale (when the standby last caught up), and its own keys
// unmarked. With Forward and Stale, the owner answers while it can (no
// mark); once its endpoint stops answering, the standby does, marked.
func TestAStandbyAnswersMarkedStaleOnlyWhenAllowed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers, seed, want := reportsCluster(t, ctx)
	type instance struct {
		p                     *eos.Processor
		srv                   *httptest.Server
		plain, stale, forward http.Handler
	}
	var insts []*instance
	for _, name := range []string{"a", "b"} {
		mux := http.NewServeMux()
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		p := newCount(t, brokers, name, eos.Changelog("counts-changelog", eos.CreateChangelog(), eos.Standbys(1)), eos.Endpoint(srv.URL))
		in := &instance{p: p, srv: srv, plain: eoshttp.Handler(p), stale: eoshttp.Handler(p, eoshttp.Stale()),
			forward: eoshttp.Handler(p, eoshttp.Forward(nil), eoshttp.Stale())}
		mux.Handle("GET /state/{key...}", in.plain)
		insts = append(insts, in)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, len(insts))
	for _, in := range insts {
		go func() { done <- in.p.Run(runCtx) }()
	}
	a, b := insts[0], insts[1]
	waitCounted(t, ctx, seed, func() bool { return slices.Equal(a.p.State().Standbys(), b.p.State().Partitions()) }, a.p, b.p)
	time.Sleep(2500 * time.Millisecond) // a catch-up past the last commit
	serve := func(h http.Handler, key string) *httptest.ResponseRecorder {
		mux := http.NewServeMux()
		mux.Handle("GET /state/{key...}", h)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/state/"+url.PathEscape(key), nil).WithContext(ctx))
		return rec
	}
	checkStale := func(what string, rec *httptest.ResponseRecorder, n int) {
		t.Helper()
		asOf, err := time.Parse(time.RFC3339Nano, rec.Header().Get(eoshttp.StaleHeader))
		switch {
		case rec.Code != http.StatusOK || rec.Body.String() != strconv.Itoa(n):
			t.Errorf("%s: %d %q, want 200 %d", what, rec.Code, rec.Body, n)
		case err != nil:
			t.Errorf("%s: %s %q: %v, want when the standby caught up", what, eoshttp.StaleHeader, rec.Header().Get(eoshttp.StaleHeader), err)
		case time.Since(asOf) > 5*time.Second || time.Until(asOf) > 0:
			t.Errorf("%s: caught up at %v, want within the last catch-ups", what, asOf)
		}
	}
	others := 0
	for key, n := range want {
		if slices.Contains(a.p.State().Partitions(), mustPartition(t, a.p, key)) {
			if rec := serve(a.stale, key); rec.Code != http.StatusOK || rec.Header().Get(eoshttp.StaleHeader) != "" {
				t.Errorf("a's own %s with Stale: %d %q stale %q, want 200 unmarked", key, rec.Code, rec.Body, rec.Header().Get(eoshttp.StaleHeader))
			}
			continue
		}
		others++
		if rec := serve(a.plain, key); rec.Code != http.StatusMisdirectedRequest || rec.Header().Get(eoshttp.StaleHeader) != "" {
			t.Errorf("b's %s without Stale: %d %q, want 421 unmarked", key, rec.Code, rec.Body)
		}
		checkStale("b's "+key+" with Stale", serve(a.stale, key), n)
		// Forwarded here as to its owner: never answered stale.
		fwd := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/state/"+url.PathEscape(key), nil).WithContext(ctx)
		req.Header.Set(eoshttp.ForwardedHeader, "1")
		mux := http.NewServeMux()
		mux.Handle("GET /state/{key...}", a.stale)
		mux.ServeHTTP(fwd, req)
		if fwd.Code != http.StatusMisdirectedRequest || fwd.Header().Get(eoshttp.StaleHeader) != "" {
			t.Errorf("b's %s forwarded to a, with Stale: %d %q, want 421 unmarked", key, fwd.Code, fwd.Body)
		}
		if rec := serve(a.forward, key); rec.Code != http.StatusOK || rec.Body.String() != strconv.Itoa(n) ||
			rec.Header().Get(eoshttp.StaleHeader) != "" || rec.Header().Get(eoshttp.ForwardedHeader) != b.srv.URL {
			t.Errorf("b's %s with Forward and Stale, b answering: %d %q stale %q forwarded %q; want b's 200 %d, unmarked",
				key, rec.Code, rec.Body, rec.Header().Get(eoshttp.StaleHeader), rec.Header().Get(eoshttp.ForwardedHeader), n)
		}
	}
	if others == 0 {
		t.Fatal("b holds no region's partition: the test asks nothing stale")
	}
	b.srv.Close() // b still runs and holds its partitions; its endpoint is gone
	for key, n := range want {
		if !slices.Contains(a.p.State().Partitions(), mustPartition(t, a.p, key)) {
			checkStale("b's "+key+" with Forward and Stale, b silent", serve(a.forward, key), n)
		}
	}
	stop()
	for range insts {
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	// Run returned: no standby is kept, nothing answers stale.
	for key := range want {
		if rec := serve(a.stale, key); rec.Code != http.StatusServiceUnavailable || rec.Header().Get(eoshttp.StaleHeader) != "" {
			body, _ := io.ReadAll(rec.Body)
			t.Fatalf("%s after Run returned: %d %q, want 503 unmarked", key, rec.Code, body)
		}
	}
}

// No handler relays another instance's stale answer: an owner (here a
// stand-in for an instance that answers a forwarded request from a
// standby, as none of this package's does) answers marked Eoskit-Stale,
// and the handler that forwarded the request answers 503, with Stale or
// without (it keeps no standby of the partition to fall back on).
func TestAStaleAnswerOfAnotherInstanceIsNeverRelayed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers, seed, _ := reportsCluster(t, ctx)
	var asked atomic.Int64
	standIn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set(eoshttp.StaleHeader, time.Now().UTC().Format(time.RFC3339Nano))
		_, _ = w.Write([]byte("7"))
	}))
	t.Cleanup(standIn.Close)
	a := newCount(t, brokers, "a", eos.Changelog("counts-changelog", eos.CreateChangelog()), eos.Endpoint("http://a.example:8080"))
	c := newCount(t, brokers, "c", eos.Changelog("counts-changelog", eos.CreateChangelog()), eos.Endpoint(standIn.URL))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	for _, p := range []*eos.Processor{a, c} {
		go func() { done <- p.Run(runCtx) }()
	}
	waitCounted(t, ctx, seed, nil, a, c)
	key := ""
	for i := range 12 {
		if k := "region/" + strconv.Itoa(i); slices.Contains(c.State().Partitions(), mustPartition(t, a, k)) {
			key = k
		}
	}
	serve := func(h http.Handler) *httptest.ResponseRecorder {
		mux := http.NewServeMux()
		mux.Handle("GET /state/{key...}", h)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/state/"+url.PathEscape(key), nil).WithContext(ctx))
		return rec
	}
	for name, h := range map[string]http.Handler{
		"without Stale": eoshttp.Handler(a, eoshttp.Forward(nil)),
		"with Stale":    eoshttp.Handler(a, eoshttp.Forward(nil), eoshttp.Stale()),
	} {
		if rec := serve(h); rec.Code != http.StatusServiceUnavailable || rec.Header().Get(eoshttp.StaleHeader) != "" {
			t.Errorf("%s, the owner answering stale: %d %q (stale %q), want 503 unmarked", name, rec.Code, rec.Body, rec.Header().Get(eoshttp.StaleHeader))
		}
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("the owner was asked %d times, want 2 (the test asks nothing)", n)
	}
	stop()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}
