package eoshttp_test

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eoshttp"
	"github.com/eoskit/eoskit/state"
)

// counts renders a count's partition as {key: count}.
func counts(view *eos.StateView, p int32) (any, error) {
	out := map[string]int{}
	var bad error
	err := view.ScanPartition(p, nil, nil, func(k, v []byte) bool {
		n, err := strconv.Atoi(string(v))
		out[string(k)], bad = n, err
		return err == nil
	})
	if err == nil {
		err = bad
	}
	return out, err
}

// Two instances split a count's three partitions, each serving
// /counts/{partition} with Forward: asked of one instance, every
// partition is answered, its own from its state and the other's relayed
// from the other (Eoskit-Forwarded names it; the caller's credentials,
// named by ForwardHeaders, passed to the other's authentication), and the
// partitions' counts
// add up to every region's. The same handler without Forward answers the
// other's partitions 421; a partition that is no number is a 400, one the
// input lacks a 404; before Run learnt the partitions, and after it
// returned, a 503.
func TestPartitionIsServedByItsOwnerFromAnyInstance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers, _, want := reportsCluster(t, ctx)
	type instance struct {
		p        *eos.Processor
		srv      *httptest.Server
		unrouted http.Handler
	}
	start := func(name string) *instance {
		mux := http.NewServeMux()
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		p := newCount(t, brokers, name, eos.Changelog("counts-changelog", eos.CreateChangelog()), eos.Endpoint(srv.URL))
		// Behind an authentication of the application's: a request
		// relayed to the owner carries the caller's credentials.
		authenticated := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer reader" {
					w.Header().Set("WWW-Authenticate", "Bearer")
					http.Error(w, "who are you", http.StatusUnauthorized)
					return
				}
				h.ServeHTTP(w, r)
			})
		}
		mux.Handle("GET /counts/{partition}", authenticated(eoshttp.Partition(p, counts, eoshttp.Forward(nil), eoshttp.ForwardHeaders("authorization", "Connection"))))
		// Without ForwardHeaders, the caller's credentials stay here.
		mux.Handle("GET /bare/{partition}", authenticated(eoshttp.Partition(p, counts, eoshttp.Forward(nil))))
		unrouted := http.NewServeMux()
		unrouted.Handle("GET /counts/{partition}", eoshttp.Partition(p, counts))
		return &instance{p: p, srv: srv, unrouted: unrouted}
	}
	a, b := start("a"), start("b")
	get := func(path string) (*http.Response, []byte) {
		req, err := http.NewRequest(http.MethodGet, a.srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer reader")
		req.Header.Set("Connection", "close, X-Hop")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, body
	}
	if resp, body := get("/counts/0"); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("before Run: %d %q, want 503 with Retry-After", resp.StatusCode, body)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	for _, in := range []*instance{a, b} {
		go func() { done <- in.p.Run(runCtx) }()
	}
	// Until both hold partitions and every report is counted.
	for {
		total := map[string]int{}
		all := len(a.p.State().Partitions()) > 0 && len(b.p.State().Partitions()) > 0
		for p := range 3 {
			resp, body := get("/counts/" + strconv.Itoa(p))
			var part map[string]int
			if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &part) != nil {
				all = false
				continue
			}
			maps.Copy(total, part)
		}
		if all && maps.Equal(total, want) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the partitions read through one instance add up to %v, want %v", total, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	held := map[int32]bool{}
	for _, p := range a.p.State().Partitions() {
		held[p] = true
	}
	for p := range int32(3) {
		resp, body := get("/counts/" + strconv.Itoa(int(p)))
		if resp.StatusCode != http.StatusOK || resp.Header.Get(eoshttp.PartitionHeader) != strconv.Itoa(int(p)) {
			t.Errorf("partition %d: %d %q, partition header %q", p, resp.StatusCode, body, resp.Header.Get(eoshttp.PartitionHeader))
		}
		if fwd := resp.Header.Get(eoshttp.ForwardedHeader); held[p] != (fwd == "") || (!held[p] && fwd != b.srv.URL) {
			t.Errorf("partition %d (held by the instance asked: %v): forwarded from %q", p, held[p], fwd)
		}
		if resp, body := get("/bare/" + strconv.Itoa(int(p))); !held[p] && (resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") != "Bearer") {
			t.Errorf("partition %d forwarded without ForwardHeaders: %d %q (WWW-Authenticate %q), want the owner's 401", p, resp.StatusCode, body, resp.Header.Get("WWW-Authenticate"))
		}
		rec := httptest.NewRecorder()
		a.unrouted.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/counts/"+strconv.Itoa(int(p)), nil))
		if want := map[bool]int{true: http.StatusOK, false: http.StatusMisdirectedRequest}[held[p]]; rec.Code != want {
			t.Errorf("partition %d without Forward: %d, want %d", p, rec.Code, want)
		}
	}
	for path, code := range map[string]int{"/counts/x": http.StatusBadRequest, "/counts/-1": http.StatusBadRequest, "/counts/3": http.StatusNotFound} {
		if resp, body := get(path); resp.StatusCode != code {
			t.Errorf("%s: %d %q, want %d", path, resp.StatusCode, body, code)
		}
	}
	stop()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	rec := httptest.NewRecorder()
	a.unrouted.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/counts/0", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("after Run returned: %d %q, want 503", rec.Code, rec.Body)
	}
}

// gatedStore holds every Apply until its gate opens: a restore that takes
// as long as the test wants.
type gatedStore struct {
	state.Store
	gate chan struct{}
}

func (g gatedStore) Apply(ws []state.Write, cp state.Checkpoint) error {
	<-g.gate
	return g.Store.Apply(ws, cp)
}

// A count is restored from its changelog by a second processor whose
// stores hold the restore's writes: while they restore, a key and a
// partition are answered 503 with Retry-After (never a 404 or an empty
// partition), and Health is not ready; once the restore goes on, the
// counts are answered whole.
func TestARestoringPartitionIsAnswered503(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers, _, want := reportsCluster(t, ctx)
	newProc := func(name string, stores state.Factory) *eos.Processor {
		return newCount(t, brokers, name, eos.Changelog("counts-changelog", eos.CreateChangelog(), eos.Stores(stores)))
	}
	runUntil := func(p *eos.Processor, until func() bool) (stop func()) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		for !until() {
			if ctx.Err() != nil {
				t.Fatal("timed out")
			}
			time.Sleep(20 * time.Millisecond)
		}
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	first := newProc("first", state.MemoryFactory())
	// Every key committed, and the keys in each of the three partitions,
	// so that every partition's changelog holds records the second's
	// restore must apply (an empty one restores at once).
	runUntil(first, func() bool {
		parts := map[int32]bool{}
		for key, n := range want {
			if v, ok, _ := first.State().Lookup([]byte(key)); !ok || string(v) != strconv.Itoa(n) {
				return false
			}
			p, err := first.State().PartitionOf([]byte(key))
			if err != nil {
				return false
			}
			parts[p] = true
		}
		if len(parts) != 3 {
			t.Fatalf("the keys fall in partitions %v: the test needs every partition's changelog to hold one", parts)
		}
		return true
	})()

	gate := make(chan struct{})
	second := newProc("second", func(string, int32) (state.Store, error) { return gatedStore{state.NewMemory(), gate}, nil })
	mux := http.NewServeMux()
	mux.Handle("GET /state/{key...}", eoshttp.Handler(second))
	mux.Handle("GET /counts/{partition}", eoshttp.Partition(second, counts))
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	stop := runUntil(second, func() bool { return second.Health().Running && len(second.Health().Assigned) > 0 })
	for _, path := range []string{"/state/region%2F0", "/counts/0", "/counts/1", "/counts/2"} {
		if rec := get(path); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Errorf("%s while restoring: %d %q, want 503 with Retry-After", path, rec.Code, rec.Body)
		}
	}
	if second.Health().Ready() {
		t.Error("ready while restoring")
	}
	close(gate)
	for {
		total := map[string]int{}
		for p := range 3 {
			var part map[string]int
			if rec := get("/counts/" + strconv.Itoa(p)); rec.Code == http.StatusOK && json.Unmarshal(rec.Body.Bytes(), &part) == nil {
				maps.Copy(total, part)
			}
		}
		if maps.Equal(total, want) && second.Health().Ready() {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("after the restore: %v, want %v", total, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
}
