package eos_test

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// A grouped count that purges its repartition topic (PurgeRepartition)
// while its aggregation lags: the aggregating handler is held after its
// first records while the re-keying one writes on and purges run. A
// purge never reaches past what the aggregation committed (the topic's
// start stays at or below its committed offsets, read stable). Then the
// instance stops abruptly (DrainTimeout(0): the held transaction aborts,
// its records to be read again), and a second instance counts every
// report once, nothing lost to a purge; at the end the topic starts at
// the committed offsets: what was counted is gone.
func TestPurgeRepartitionDeletesOnlyWhatWasCounted(t *testing.T) {
	brokers := groupedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seed := reportsClient(t, brokers)
	adm := kadm.NewClient(seed)
	want := map[string]string{}
	counts := map[string]int{}
	for i := range 600 {
		region := []string{"north", "south", "east", "west"}[i%4]
		if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte("r-" + strconv.Itoa(i)), Value: []byte(region)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		counts[region]++
	}
	for r, n := range counts {
		want[r] = strconv.Itoa(n)
	}
	var handled atomic.Int64
	count := eos.Count()
	held := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if handled.Add(1) > 100 {
			<-ctx.Done() // until the instance stops
			return nil, ctx.Err()
		}
		return count(ctx, r)
	}
	// start runs a grouped count with handler h, and returns its stop.
	start := func(h eos.HandlerFunc) func() {
		g, err := eos.NewGrouped(regionOfValue, "by-region", h, append(groupedOpts(t, brokers), eos.PurgeRepartition(50*time.Millisecond),
			eos.MaxRecordsPerCommit(20), eos.DrainTimeout(0))...)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- g.Run(runCtx) }()
		return func() {
			t.Helper()
			stop()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return within 30 s of its stop")
			}
		}
	}
	stop := start(held)

	// starts are the repartition topic's start offsets; committed the
	// aggregation's.
	starts := func() map[int32]int64 {
		listed, err := adm.ListStartOffsets(ctx, "by-region")
		if err != nil {
			t.Fatal(err)
		}
		m := map[int32]int64{}
		listed.Each(func(o kadm.ListedOffset) { m[o.Partition] = o.Offset })
		return m
	}
	committed := func() map[int32]int64 {
		fetched, err := adm.FetchOffsets(kadm.RequireStable(ctx), "grouped")
		if err != nil {
			t.Fatal(err)
		}
		m := map[int32]int64{}
		fetched.Each(func(o kadm.OffsetResponse) {
			if o.Topic == "by-region" {
				m[o.Partition] = o.At
			}
		})
		return m
	}
	// While held: the re-keying processor writes every report, purges run
	// (20 of them), and none passes the committed offsets.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ends, err := adm.ListEndOffsets(ctx, "by-region")
		if err != nil {
			t.Fatal(err)
		}
		var rekeyed int64
		ends.Each(func(o kadm.ListedOffset) { rekeyed += o.Offset })
		if rekeyed >= 600 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 600 reports re-keyed within 30 s", rekeyed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for handled.Load() <= 100 {
		if time.Now().After(deadline) {
			t.Fatalf("the aggregation handled %d reports within 30 s; want it held at its 101st", handled.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	purgedAny := false
	for range 20 {
		time.Sleep(50 * time.Millisecond)
		c, s := committed(), starts()
		for p, at := range s {
			if at > c[p] {
				t.Fatalf("partition %d of the repartition topic starts at %d, past the aggregation's committed offset %d: uncounted records purged", p, at, c[p])
			}
			purgedAny = purgedAny || at > 0
		}
	}
	if !purgedAny {
		t.Fatal("no record was purged while the aggregation had committed some")
	}
	if handled.Load() >= 600 {
		t.Fatal("the aggregation was not held: it handled every report")
	}
	stop() // the held transaction aborts
	stop = start(count)
	got := map[string]string{}
	countCtx, countCancel := context.WithTimeout(ctx, 30*time.Second)
	defer countCancel()
	for !maps.Equal(got, want) && countCtx.Err() == nil {
		for _, r := range readCommitted(t, brokers, "counts") {
			got[string(r.Key)] = string(r.Value)
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("counts %v, want %v: purged records went uncounted (the repartition topic starts at %v)", got, want, starts())
	}
	// Once everything is counted, a purge deletes it all: the topic
	// starts at the committed offsets (the last counted record's next,
	// commit markers included).
	deadline = time.Now().Add(20 * time.Second)
	for {
		c, s := committed(), starts()
		all := true
		for p, at := range s {
			all = all && at == c[p] // c[p] 0 for a partition no report went to
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the repartition topic starts at %v, the committed offsets are %v: want every counted record purged", s, c)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
}

// PurgeRepartition is NewGrouped's: NewProcessor refuses it, and
// NewGrouped refuses an interval that is not positive.
func TestPurgeRepartitionIsRefusedWhereItCannotApply(t *testing.T) {
	var ce *eoskit.ConfigError
	_, err := eos.NewProcessor(copyHandler("out"), eos.Brokers("localhost:9092"), eos.Group("g"), eos.Topics("in"), eos.TransactionalID("g-0"),
		eos.PurgeRepartition(time.Second))
	if !errors.As(err, &ce) || ce.Setting != "PurgeRepartition" {
		t.Fatalf("NewProcessor with PurgeRepartition: %v; want a ConfigError for PurgeRepartition", err)
	}
	_, err = eos.NewGrouped(regionOfValue, "by-region", eos.Count(), append(groupedOpts(t, []string{"localhost:9092"}), eos.PurgeRepartition(0))...)
	if !errors.As(err, &ce) || ce.Setting != "PurgeRepartition" {
		t.Fatalf("NewGrouped with PurgeRepartition(0): %v; want a ConfigError for PurgeRepartition", err)
	}
}
