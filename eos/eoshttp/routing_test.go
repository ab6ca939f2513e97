package eoshttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eoshttp"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/internal/loop"
)

// Reads routed through one instance while the group changes on a real
// broker, under the classic protocol's eager range balancer (every
// partition revoked at each rebalance) and under KIP-848's consumer
// protocol: reports keep coming over six partitions while a third
// instance joins and leaves, and a reader asks every region's count of
// the first instance over and over (it forwards what it does not hold).
// Each count answered is the owner's committed one, so no answer may be
// below one already answered for that region (a stale owner's would
// be); a read is answered or refused (421, 503), never wrong; at the end
// every region's count, read through the first instance, is the number of
// its reports.
func TestRoutedReadsNeverGoBackThroughRebalances(t *testing.T) {
	for _, protocol := range []string{"range", "consumer"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			k := integration.Kafka(t)
			if protocol == "consumer" {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				refusal, err := loop.CheckConsumerProtocol(ctx, k.Client())
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				if refusal != "" {
					t.Skipf("the consumer protocol is refused on this cluster: %s", refusal)
				}
			}
			routedReads(t, k, protocol)
		})
	}
}

func routedReads(t *testing.T, k *integration.KafkaCluster, protocol string) {
	in := k.NewTopic(6)
	changelog := integration.UniqueName(t, "changelog")
	compact := "compact"
	k.CreateTopic(changelog, 6, map[string]*string{"cleanup.policy": &compact})
	group := integration.UniqueName(t, "routed")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const regions = 12
	var produced [regions]atomic.Int64
	producer := k.Client(kgo.DefaultProduceTopic(in))
	defer producer.Close()
	produce := func(n int) {
		for i := range n {
			r := i % regions
			if err := producer.ProduceSync(ctx, &kgo.Record{Key: []byte("region-" + strconv.Itoa(r))}).FirstErr(); err != nil {
				t.Error(err)
				return
			}
			produced[r].Add(1)
		}
	}
	produce(600)

	type instance struct {
		p    *eos.Processor
		srv  *httptest.Server
		stop context.CancelFunc
		done chan error
	}
	start := func(name string) *instance {
		mux := http.NewServeMux()
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		opts := []eos.ProcessorOption{eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in), eos.TransactionalID(group + "-" + name),
			eos.CommitInterval(50 * time.Millisecond), eos.Changelog(changelog), eos.Endpoint(srv.URL)}
		if protocol == "consumer" {
			opts = append(opts, eos.ConsumerProtocol())
		} else {
			opts = append(opts, eos.ClientOptions(kgo.Balancers(kgo.RangeBalancer())))
		}
		p, err := eos.NewProcessor(eos.Count(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		mux.Handle("GET /state/{key...}", eoshttp.Handler(p, eoshttp.Forward(nil)))
		runCtx, stop := context.WithCancel(ctx)
		in := &instance{p: p, srv: srv, stop: stop, done: make(chan error, 1)}
		go func() { in.done <- p.Run(runCtx) }()
		t.Cleanup(stop)
		return in
	}
	a, b := start("a"), start("b")

	// The reader: every region through a, over and over.
	var (
		mu       sync.Mutex
		highest  [regions]int64
		answered [regions]int
		codes    = map[int]int{}
		wrong    []string
	)
	read := func(r int) (int, int64) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.srv.URL+"/state/region-"+strconv.Itoa(r), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, 0
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		n, _ := strconv.ParseInt(string(body), 10, 64)
		return resp.StatusCode, n
	}
	readerCtx, stopReader := context.WithCancel(ctx)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for readerCtx.Err() == nil {
			for r := range regions {
				code, n := read(r)
				mu.Lock()
				codes[code]++
				switch code {
				case http.StatusOK:
					if n < highest[r] {
						wrong = append(wrong, "region-"+strconv.Itoa(r)+": "+strconv.FormatInt(n, 10)+" after "+strconv.FormatInt(highest[r], 10))
					}
					highest[r] = max(highest[r], n)
					answered[r]++
				case http.StatusMisdirectedRequest, http.StatusServiceUnavailable, http.StatusNotFound:
				default:
					wrong = append(wrong, "region-"+strconv.Itoa(r)+": status "+strconv.Itoa(code))
				}
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	waitHeld := func(what string, insts ...*instance) {
		deadline := time.Now().Add(90 * time.Second)
		for {
			held := 0
			for _, in := range insts {
				n := len(in.p.State().Partitions())
				if n == 0 {
					held = -100
				}
				held += n
			}
			if held == 6 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the instances did not split the six partitions within 90 s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitHeld("a and b", a, b)
	produce(600)
	c := start("c")
	waitHeld("a, b and c", a, b, c)
	produce(600)
	c.stop()
	if err := <-c.done; err != nil {
		t.Fatalf("c: %v", err)
	}
	waitHeld("a and b again", a, b)
	produce(600)
	k.WaitCaughtUp(group, in, 2*time.Minute)

	// The end: every region's count through a is its reports'.
	deadline := time.Now().Add(30 * time.Second)
	for r := 0; r < regions; {
		code, n := read(r)
		if code == http.StatusOK && n == produced[r].Load() {
			r++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("region-%d through a: %d %d, want 200 %d", r, code, n, produced[r].Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopReader()
	<-readerDone
	mu.Lock()
	defer mu.Unlock()
	if len(wrong) > 0 {
		t.Fatalf("%d wrong answers, the first: %v", len(wrong), wrong[:min(5, len(wrong))])
	}
	for r := range regions {
		if answered[r] == 0 {
			t.Fatalf("region-%d never answered during the run: the test checked nothing", r)
		}
	}
	t.Logf("answers through a while the group changed: %v (status: count)", codes)
	for _, in := range []*instance{a, b} {
		in.stop()
		if err := <-in.done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}
