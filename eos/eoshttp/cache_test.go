package eoshttp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eoshttp"
)

// A partition served with Cache is rendered once per committed change of
// its state: asked again and again it renders once (the same handler
// without Cache renders on every request); a report counted in it
// renders it again, with the new count; one counted in another
// partition does not; ten requests at once after a change render once.
// Once Run returned, it answers 503 and renders nothing.
func TestACachedPartitionRendersOncePerCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers, seed, want := reportsCluster(t, ctx)
	p := newCount(t, brokers, "a", eos.Changelog("counts-changelog", eos.CreateChangelog()))
	var cachedRenders, plainRenders atomic.Int64
	counting := func(n *atomic.Int64) eoshttp.RenderFunc {
		return func(view *eos.StateView, part int32) (any, error) {
			n.Add(1)
			return counts(view, part)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /cached/{partition}", eoshttp.Partition(p, counting(&cachedRenders), eoshttp.Cache()))
	mux.Handle("GET /plain/{partition}", eoshttp.Partition(p, counting(&plainRenders)))
	get := func(path string) (int, map[string]int) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var part map[string]int
		if rec.Code == http.StatusOK {
			if err := json.Unmarshal(rec.Body.Bytes(), &part); err != nil {
				t.Fatalf("%s: %q: %v", path, rec.Body, err)
			}
		}
		return rec.Code, part
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	for _, err := p.State().InputPartitions(); err != nil; _, err = p.State().InputPartitions() {
		if ctx.Err() != nil {
			t.Fatal("Run did not learn the input's partitions")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// region/0 and a region of another partition.
	p0 := mustPartition(t, p, "region/0")
	other := ""
	for key := range want {
		if mustPartition(t, p, key) != p0 {
			other = key
		}
	}
	counted := func(key string, n int) func() bool {
		return func() bool {
			v, _, err := p.State().Lookup([]byte(key))
			return err == nil && string(v) == strconv.Itoa(n)
		}
	}
	for !counted("region/0", want["region/0"])() || !counted(other, want[other])() {
		if ctx.Err() != nil {
			t.Fatal("the reports were not counted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	path := "/cached/" + strconv.Itoa(int(p0))
	var first map[string]int
	for i := range 5 {
		code, part := get(path)
		if code != http.StatusOK || part["region/0"] != want["region/0"] {
			t.Fatalf("request %d: %d %v, want 200 with region/0 at %d", i, code, part, want["region/0"])
		}
		first = part
		get("/plain/" + strconv.Itoa(int(p0)))
	}
	if n := cachedRenders.Load(); n != 1 {
		t.Fatalf("5 requests with nothing committed rendered %d times, want 1", n)
	}
	if n := plainRenders.Load(); n != 5 {
		t.Fatalf("5 requests without Cache rendered %d times, want 5", n)
	}
	produce := func(key string) {
		if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte(key)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		want[key]++
		for !counted(key, want[key])() {
			if ctx.Err() != nil {
				t.Fatalf("%s was not counted", key)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	produce(other) // another partition's commit
	if _, part := get(path); cachedRenders.Load() != 1 || part["region/0"] != first["region/0"] {
		t.Fatalf("after a commit in another partition: %d renders, region/0 at %d; want 1, %d", cachedRenders.Load(), part["region/0"], first["region/0"])
	}
	produce("region/0")
	results := make(chan string, 10)
	for range 10 {
		go func() { // no t.Fatal here: the bodies are checked below
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			results <- strconv.Itoa(rec.Code) + " " + rec.Body.String()
		}()
	}
	for range 10 {
		got := <-results
		var part map[string]int
		code, body, _ := strings.Cut(got, " ")
		if code != "200" || json.Unmarshal([]byte(body), &part) != nil || part["region/0"] != want["region/0"] {
			t.Errorf("after region/0's report was committed: %s, want 200 with region/0 at %d", got, want["region/0"])
		}
	}
	if n := cachedRenders.Load(); n != 2 {
		t.Fatalf("ten requests after one commit in the partition: %d renders in all, want 2", n)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if code, _ := get(path); code != http.StatusServiceUnavailable || cachedRenders.Load() != 2 {
		t.Fatalf("after Run returned: %d, %d renders; want 503, 2", code, cachedRenders.Load())
	}
}
