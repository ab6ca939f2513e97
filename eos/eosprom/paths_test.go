package eosprom_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eosprom"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/offsetstore"
)

// One eosprom.Metrics given to an eos processor, an offsetstore runner and a
// dedup consumer counts each one's work under its own path label, and each
// runner's Health shows its partitions, a recent commit and a lag that
// drains to 0, while it runs and not after. A partition callback the
// caller passes through each runner's ClientOptions runs too (before, the
// runners' own replaced it: franz-go keeps one).
func TestOneMetricsServesEveryPath(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	pool := integration.Postgres(t)
	ctx := context.Background()
	in, out := k.NewTopic(3), k.NewTopic(1)
	k.SeedHostile(in, 600, 50)
	// Then a record per partition from a plain producer, after which no
	// marker or aborted record stands: lag counts offsets (see Health).
	tail := k.Client(kgo.DefaultProduceTopic(in), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := range int32(3) {
		if err := tail.ProduceSync(ctx, &kgo.Record{Key: fmt.Appendf(nil, "tail-%d", p), Value: []byte("tail"), Partition: p}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const n = 603
	if err := offsetstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	store, err := dedup.NewPostgresStore("")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	m, err := eosprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}

	// Each runner gets a partition callback of the caller's through
	// ClientOptions: it runs beside the runner's own, not instead.
	var mu sync.Mutex
	assignedTo := map[string]int{}
	userAssigned := func(path string) kgo.Opt {
		return kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			mu.Lock()
			defer mu.Unlock()
			assignedTo[path] += len(parts[in])
		})
	}
	failedOnce := false
	txnID, _ := eos.StableTransactionalID(integration.UniqueName(t, "g"), "0")
	p, err := eos.NewProcessor(func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if !failedOnce {
			failedOnce = true
			return nil, errors.New("fails once")
		}
		return []*kgo.Record{{Topic: out, Value: r.Value}}, nil
	}, eos.Brokers(k.Brokers...), eos.Group(integration.UniqueName(t, "eos")), eos.Topics(in), eos.TransactionalID(txnID),
		eos.OnHandlerError(eoskit.Retry(time.Millisecond, 2)), eos.WithMetrics(m), eos.ClientOptions(userAssigned("eos")))
	if err != nil {
		t.Fatal(err)
	}
	r, err := offsetstore.NewRunner(pool, func(context.Context, pgx.Tx, []*kgo.Record) error { return nil },
		offsetstore.Brokers(k.Brokers...), offsetstore.Group(integration.UniqueName(t, "os")), offsetstore.Topics(in), offsetstore.WithMetrics(m),
		offsetstore.ClientOptions(userAssigned("offsetstore")))
	if err != nil {
		t.Fatal(err)
	}
	c, err := dedup.NewConsumer(pool, store, func(context.Context, pgx.Tx, *kgo.Record) error { return nil },
		dedup.Brokers(k.Brokers...), dedup.Group(integration.UniqueName(t, "dd")), dedup.Topics(in), dedup.ID(dedup.KeyID()),
		dedup.WithMetrics(m), dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), userAssigned("dedup")))
	if err != nil {
		t.Fatal(err)
	}
	type runner struct {
		name   string
		run    func(context.Context) error
		health func() eoskit.Health
	}
	runners := []runner{{"eos", p.Run, p.Health}, {"offsetstore", r.Run, r.Health}, {"dedup", c.Run, c.Health}}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, len(runners))
	for _, rn := range runners {
		go func() { done <- rn.run(runCtx) }()
	}

	recordsIn := func(path string) float64 {
		return testutil.ToFloat64(mustCurry(t, reg, "eoskit_processor_records_in_total", path))
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, rn := range runners {
		for {
			h := rn.health()
			lagged := false
			for _, parts := range h.Lag {
				for _, l := range parts {
					lagged = lagged || l > 0
				}
			}
			if recordsIn(rn.name) >= n && h.Healthy() && len(h.Assigned[in]) == 3 && len(h.Lag[in]) > 0 && !lagged {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: records in %v, health %+v; want %d records in, healthy, 3 partitions assigned, lag 0", rn.name, recordsIn(rn.name), h, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	cancel()
	for range runners {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for _, rn := range runners {
		if h := rn.health(); h.Running || h.Healthy() || h.Path != rn.name {
			t.Errorf("%s after Run returned: %+v; want not running, not healthy, path %q", rn.name, h, rn.name)
		}
		if got := recordsIn(rn.name); got != n {
			t.Errorf("%s: records_in_total %v, want %d (committed work only, aborted inputs never)", rn.name, got, n)
		}
	}
	mu.Lock()
	for _, rn := range runners {
		if assignedTo[rn.name] != 3 {
			t.Errorf("%s: the caller's OnPartitionsAssigned saw %d partitions, want the 3 the runner's own saw", rn.name, assignedTo[rn.name])
		}
	}
	mu.Unlock()
	if got := testutil.ToFloat64(mustCurry(t, reg, "eoskit_processor_records_out_total", "eos")); got != n {
		t.Errorf("eos: records_out_total %v, want %d", got, n)
	}
	// Handler calls: every record once per path, and eos's failed one.
	if _, err := reg.Gather(); err != nil { // the pedantic registry checks every series
		t.Fatal(err)
	}
	counts := handlerCounts(t, reg)
	if counts["eos/error"] != 1 || counts["eos/ok"] < n || counts["dedup/ok"] < n || counts["offsetstore/ok"] < 1 {
		t.Errorf("handler calls by path/outcome: %v; want eos 1 error and %d ok, dedup %d ok, offsetstore at least one batch", counts, n, n)
	}
}

// mustCurry returns the single-path series of a counter family.
func mustCurry(t *testing.T, reg *prometheus.Registry, name, path string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "path" && l.GetValue() == path {
					return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"}, func() float64 { return mt.GetCounter().GetValue() })
				}
			}
		}
	}
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"}, func() float64 { return 0 })
}

func handlerCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "eoskit_processor_handler_duration_seconds" {
			continue
		}
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			counts[fmt.Sprintf("%s/%s", labels["path"], labels["outcome"])] = mt.GetHistogram().GetSampleCount()
		}
	}
	return counts
}
