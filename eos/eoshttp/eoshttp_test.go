package eoshttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eoshttp"
)

// Two instances of a count split three partitions: each answers the
// keys of the partitions it holds with their counts (200), a key with
// none there as absent (404), and the keys of the other's partitions as
// misdirected (421, naming the partition), never as absent; before Run
// learnt the input's partitions, and once it returned, it answers 503 (it
// cannot tell whose a key is). A key with a "/" is asked escaped; a POST
// is refused.
func TestEachInstanceAnswersItsKeysAndRedirectsTheOthers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers, seed, want := reportsCluster(t, ctx)
	newProc := func(instance string) *eos.Processor {
		return newCount(t, brokers, instance, eos.Changelog("counts-changelog", eos.CreateChangelog()))
	}
	procs := []*eos.Processor{newProc("a"), newProc("b")}
	serve := func(p *eos.Processor, method, key string) *httptest.ResponseRecorder {
		mux := http.NewServeMux()
		mux.Handle("/state/{key...}", eoshttp.Handler(p))
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(method, "/state/"+url.PathEscape(key), nil))
		if rec.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("%s %s: Cache-Control %q, want no-store", method, key, rec.Header().Get("Cache-Control"))
		}
		return rec
	}
	get := func(p *eos.Processor, key string) *httptest.ResponseRecorder { return serve(p, http.MethodGet, key) }
	if rec := serve(procs[0], http.MethodPost, "region/1"); rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d, want 405", rec.Code)
	}
	if rec := get(procs[0], "region-1"); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("before Run: %d %q, want 503 with Retry-After", rec.Code, rec.Body)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, len(procs))
	for _, p := range procs {
		go func() { done <- p.Run(runCtx) }()
	}
	waitCounted(t, ctx, seed, nil, procs...)
	for key, n := range want {
		answered := 0
		for i, p := range procs {
			rec := get(p, key)
			part, _ := p.State().PartitionOf([]byte(key))
			if rec.Header().Get(eoshttp.PartitionHeader) != strconv.Itoa(int(part)) {
				t.Errorf("instance %d, %s: partition header %q, want %d", i, key, rec.Header().Get(eoshttp.PartitionHeader), part)
			}
			switch rec.Code {
			case http.StatusOK:
				answered++
				if rec.Body.String() != strconv.Itoa(n) {
					t.Errorf("instance %d, %s: %q, want %d", i, key, rec.Body, n)
				}
			case http.StatusMisdirectedRequest:
				var body struct{ Partition int32 }
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Partition != part {
					t.Errorf("instance %d, %s: 421 body %q, want partition %d", i, key, rec.Body, part)
				}
			default:
				t.Errorf("instance %d, %s: %d %q", i, key, rec.Code, rec.Body)
			}
		}
		if answered != 1 {
			t.Errorf("%s answered by %d instances, want its partition's owner alone", key, answered)
		}
	}
	// A key never counted: absent on its owner, misdirected elsewhere.
	codes := map[int]int{}
	for _, p := range procs {
		codes[get(p, "nowhere").Code]++
	}
	if codes[http.StatusNotFound] != 1 || codes[http.StatusMisdirectedRequest] != 1 {
		t.Errorf("a key never counted: %v, want one 404 and one 421", codes)
	}
	stop()
	for range procs {
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	for key := range want {
		if rec := get(procs[0], key); rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("after Run returned, %s: %d %q, want 503", key, rec.Code, rec.Body)
		}
	}
}

// Two instances advertising their endpoints (eos.Endpoint), each serving
// with Forward: every key is answered by either, with its count, the
// instance that does not hold its partition forwarding to the one that
// does (named in the answer's Eoskit-Forwarded); a request already
// forwarded is never forwarded again (421), so two instances disagreeing
// about an owner cannot loop.
func TestAnyInstanceAnswersEveryKeyByForwarding(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	brokers, seed, want := reportsCluster(t, ctx)
	type instance struct {
		p   *eos.Processor
		srv *httptest.Server
	}
	var insts []instance
	for _, name := range []string{"a", "b"} {
		mux := http.NewServeMux()
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		p := newCount(t, brokers, name, eos.Changelog("counts-changelog", eos.CreateChangelog()), eos.Endpoint(srv.URL))
		mux.Handle("GET /state/{key...}", eoshttp.Handler(p, eoshttp.Forward(nil)))
		insts = append(insts, instance{p, srv})
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, len(insts))
	for _, in := range insts {
		go func() { done <- in.p.Run(runCtx) }()
	}
	waitCounted(t, ctx, seed, nil, insts[0].p, insts[1].p)
	get := func(in instance, key string, forwarded bool) (*http.Response, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, in.srv.URL+"/state/"+url.PathEscape(key), nil)
		if forwarded {
			req.Header.Set(eoshttp.ForwardedHeader, "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	forwardedAnswers := 0
	for key, n := range want {
		owner := -1
		for i, in := range insts {
			if slices.Contains(in.p.State().Partitions(), mustPartition(t, in.p, key)) {
				owner = i
			}
		}
		for i, in := range insts {
			resp, body := get(in, key, false)
			if resp.StatusCode != http.StatusOK || body != strconv.Itoa(n) {
				t.Errorf("instance %d, %s: %d %q, want 200 %d", i, key, resp.StatusCode, body, n)
				continue
			}
			switch fwd := resp.Header.Get(eoshttp.ForwardedHeader); {
			case i == owner && fwd != "":
				t.Errorf("instance %d owns %s but forwarded it to %s", i, key, fwd)
			case i != owner && fwd != insts[owner].srv.URL:
				t.Errorf("instance %d, %s: forwarded to %q, want its owner %s", i, key, fwd, insts[owner].srv.URL)
			case i != owner:
				forwardedAnswers++
			}
			if i != owner {
				if resp, _ := get(in, key, true); resp.StatusCode != http.StatusMisdirectedRequest {
					t.Errorf("instance %d, %s already forwarded: %d, want 421 (never forwarded again)", i, key, resp.StatusCode)
				}
			}
		}
	}
	if forwardedAnswers != len(want) {
		t.Errorf("%d keys answered by forwarding, want every key's once (%d)", forwardedAnswers, len(want))
	}
	stop()
	for range insts {
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}

func mustPartition(t *testing.T, p *eos.Processor, key string) int32 {
	t.Helper()
	part, err := p.State().PartitionOf([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return part
}

// Endpoint refuses what cannot be advertised: no http(s) URL, a client id
// of one's own beside it, no state to serve.
func TestEndpointRefusals(t *testing.T) {
	base := []eos.ProcessorOption{eos.Brokers("localhost:1"), eos.Group("g"), eos.Topics("in"), eos.TransactionalID("x")}
	for name, opts := range map[string][]eos.ProcessorOption{
		"not a URL":    {eos.Changelog("c"), eos.Endpoint("10.0.0.5:8080")},
		"no host":      {eos.Changelog("c"), eos.Endpoint("http://")},
		"credentials":  {eos.Changelog("c"), eos.Endpoint("http://user:secret@10.0.0.5:8080")},
		"a query":      {eos.Changelog("c"), eos.Endpoint("http://10.0.0.5:8080/?x=1")},
		"a client id":  {eos.Changelog("c"), eos.Endpoint("http://10.0.0.5:8080"), eos.ClientOptions(kgo.ClientID("mine"))},
		"no changelog": {eos.Endpoint("http://10.0.0.5:8080")},
	} {
		_, err := eos.NewProcessor(eos.Count(), append(slices.Clone(base), opts...)...)
		var ce *eoskit.ConfigError
		if !errors.As(err, &ce) || ce.Setting != "Endpoint" {
			t.Errorf("%s: %v, want a ConfigError for Endpoint", name, err)
		}
	}
}

// waitCounted waits until procs split reportsCluster's three partitions
// (each holding some), every report's offset is committed in group
// "counts", and more holds (nil: nothing more); it fails the test at
// ctx's end.
func waitCounted(t *testing.T, ctx context.Context, seed *kgo.Client, more func() bool, procs ...*eos.Processor) {
	t.Helper()
	adm := kadm.NewClient(seed)
	for {
		offsets, err := adm.FetchOffsets(ctx, "counts")
		var at int64
		offsets.Each(func(o kadm.OffsetResponse) { at += o.At })
		held := 0
		split := err == nil && at == 120
		for _, p := range procs {
			n := len(p.State().Partitions())
			split = split && n > 0
			held += n
		}
		if split && held == 3 && (more == nil || more()) {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("the instances did not split the partitions and count every report")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// reportsCluster is a kfake cluster whose three-partition topic "reports"
// holds 120 reports over 12 regions, keys with a "/"; with a client of it
// and each region's count.
func reportsCluster(t *testing.T, ctx context.Context) (brokers []string, seed *kgo.Client, want map[string]int) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "reports"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers = cluster.ListenAddrs()
	seed, err = kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("reports"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(seed.Close)
	want = map[string]int{}
	for i := range 120 {
		key := "region/" + strconv.Itoa(i%12)
		want[key]++
		if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte(key)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return brokers, seed, want
}

// newCount is instance name's count of reportsCluster's reports, in group
// "counts" with changelog "counts-changelog", with opts.
func newCount(t *testing.T, brokers []string, name string, opts ...eos.ProcessorOption) *eos.Processor {
	t.Helper()
	p, err := eos.NewProcessor(eos.Count(), append([]eos.ProcessorOption{eos.Brokers(brokers...), eos.Group("counts"), eos.Topics("reports"),
		eos.TransactionalID("counts-" + name), eos.CommitInterval(20 * time.Millisecond), eos.Logger(slog.New(slog.DiscardHandler))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
