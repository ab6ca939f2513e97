package eoshttp_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

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
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "reports"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("reports"))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	want := map[string]int{}
	for i := range 120 {
		key := "region/" + strconv.Itoa(i%12)
		want[key]++
		if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte(key)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	newProc := func(instance string) *eos.Processor {
		p, err := eos.NewProcessor(eos.Count(), eos.Brokers(brokers...), eos.Group("counts"), eos.Topics("reports"),
			eos.TransactionalID("counts-"+instance), eos.CommitInterval(20*time.Millisecond), eos.Logger(slog.New(slog.DiscardHandler)),
			eos.Changelog("counts-changelog", eos.CreateChangelog()))
		if err != nil {
			t.Fatal(err)
		}
		return p
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
	adm := kadm.NewClient(seed)
	for {
		offsets, err := adm.FetchOffsets(ctx, "counts")
		var at int64
		offsets.Each(func(o kadm.OffsetResponse) { at += o.At })
		if err == nil && at == 120 && len(procs[0].State().Partitions()) > 0 && len(procs[1].State().Partitions()) > 0 &&
			len(procs[0].State().Partitions())+len(procs[1].State().Partitions()) == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the two instances did not split the partitions and count every report")
		}
		time.Sleep(20 * time.Millisecond)
	}
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
