package eos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/probe"
	"github.com/eoskit/eoskit/state"
)

// The examples run on franz-go's in-process fake cluster (kfake) so that
// they need no broker; the guarantees they show are proven against a real
// broker by this package's other tests.

func ExampleTransactionalProducer_Transact() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "audit"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()

	txnID, err := eos.StableTransactionalID("order-writer", "0")
	if err != nil {
		panic(err)
	}
	p, err := eos.NewTransactionalProducer(eos.Brokers(cluster.ListenAddrs()...), eos.TransactionalID(txnID))
	if err != nil {
		panic(err)
	}
	defer p.Close()

	ctx := context.Background()
	// Both records become visible together, or neither does.
	err = p.Transact(ctx, func(tx *eos.Tx) error {
		tx.Produce(&kgo.Record{Topic: "orders", Value: []byte("order-1")})
		tx.Produce(&kgo.Record{Topic: "audit", Value: []byte("order-1 created")})
		return nil
	})
	fmt.Println("committed:", err)

	err = p.Transact(ctx, func(tx *eos.Tx) error {
		tx.Produce(&kgo.Record{Topic: "orders", Value: []byte("order-2")})
		return fmt.Errorf("payment declined")
	})
	fmt.Println("aborted:", err)
	// Output:
	// committed: <nil>
	// aborted: eos: transaction aborted: payment declined
}

func ExampleNewProcessor_configError() {
	_, err := eos.NewProcessor(
		func(context.Context, *kgo.Record) ([]*kgo.Record, error) { return nil, nil },
		eos.Brokers("localhost:9092"),
		eos.Group("enricher"),
		eos.Topics("orders"),
		eos.TransactionalID("enricher-0"),
		eos.ClientOptions(kgo.FetchIsolationLevel(kgo.ReadUncommitted())),
	)
	fmt.Println(err)
	// Output:
	// eos: invalid configuration: FetchIsolationLevel: exactly-once must read with read_committed, or it consumes records of aborted transactions (semantics exactly-once)
}

func ExampleProcessor_Run() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "orders-upper"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	// The handler returns its outputs; the processor commits them together
	// with the input's offset.
	upper := func(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		return []*kgo.Record{{Topic: "orders-upper", Key: in.Key, Value: []byte(strings.ToUpper(string(in.Value)))}}, nil
	}
	txnID, _ := eos.StableTransactionalID("upper", "0")
	p, err := eos.NewProcessor(upper,
		eos.Brokers(brokers...),
		eos.Group("upper"),
		eos.Topics("orders"),
		eos.TransactionalID(txnID),
		eos.CommitInterval(50*time.Millisecond),
	)
	if err != nil {
		panic(err)
	}

	seed, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("orders"))
	defer seed.Close()
	for _, v := range []string{"apples", "pears", "plums"} {
		seed.Produce(context.Background(), &kgo.Record{Value: []byte(v)}, nil)
	}
	_ = seed.Flush(context.Background())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	reader, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders-upper"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	defer reader.Close()
	var got []string
	for len(got) < 3 {
		reader.PollFetches(context.Background()).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	cancel()
	fmt.Println(slices.Sorted(slices.Values(got)), <-done)
	// Output: [APPLES PEARS PLUMS] <nil>
}

// A readiness probe over net/http (package probe): 503 before Run and
// until the group has assigned the processor its partitions, 200 while it
// runs and makes progress (the example waits for its first commit), with
// the health view as JSON for dashboards. The liveness probe, /healthz,
// answers from Healthy, which holds while a new session still waits for
// its assignment.
func ExampleProcessor_Health() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "enriched"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	seed, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		panic(err)
	}
	defer seed.Close()
	if err := seed.ProduceSync(context.Background(), &kgo.Record{Value: []byte("order-1")}).FirstErr(); err != nil {
		panic(err)
	}

	p, err := eos.NewProcessor(func(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		return []*kgo.Record{{Topic: "enriched", Value: in.Value}}, nil
	}, eos.Brokers(cluster.ListenAddrs()...), eos.Group("enricher"), eos.Topics("orders"),
		eos.TransactionalID("enricher-0"), eos.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	probe.Routes(mux, p.Health) // GET /healthz and /readyz
	readyz := func() (int, eoskit.Health) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		var h eoskit.Health
		_ = json.Unmarshal(rec.Body.Bytes(), &h)
		return rec.Code, h
	}

	code, _ := readyz()
	fmt.Println("before Run:", code)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	// Healthy from the start (no error yet); wait for the first commit.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if code, h := readyz(); code == http.StatusOK && !h.LastCommit.IsZero() {
			break
		}
	}
	code, h := readyz()
	fmt.Println("running:", code, h.Assigned)

	cancel()
	<-done
	code, _ = readyz()
	fmt.Println("after Run:", code)
	// Output:
	// before Run: 503
	// running: 200 map[orders:[0]]
	// after Run: 503
}

// The dashboard's totals: reports counted per region in Kafka, the counts'
// changelog and one update per changed region committing in the
// processor's transaction; State serves the committed counts while Run
// works.
func ExampleCount() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "reports", "totals"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	txnID, _ := eos.StableTransactionalID("dashboard", "0")
	p, err := eos.NewProcessor(eos.Count(), eos.Brokers(brokers...), eos.Group("dashboard"),
		eos.Topics("reports"), eos.TransactionalID(txnID), eos.CommitInterval(50*time.Millisecond),
		eos.Changelog("dashboard-counts", eos.CreateChangelog(), eos.EmitUpdates("totals")),
		eos.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}

	seed, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("reports"))
	defer seed.Close()
	for _, region := range []string{"north", "south", "north", "east", "north", "south"} {
		seed.Produce(context.Background(), &kgo.Record{Key: []byte(region)}, nil)
	}
	_ = seed.Flush(context.Background())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	totals := map[string]string{}
	for sum := 0; sum < 6; {
		time.Sleep(10 * time.Millisecond)
		sum = 0
		_ = p.State().Range(func(_ int32, region, count []byte) bool {
			totals[string(region)] = string(count)
			n, _ := state.Int64(count)
			sum += int(n)
			return true
		})
	}
	cancel()
	fmt.Println(totals, <-done)
	// Output: map[east:1 north:3 south:2] <nil>
}
