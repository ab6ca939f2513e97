package eos_test

import (
	"context"
	"maps"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/state"
)

// Reports keyed by their id (spread over four partitions) counted per
// region, derived from the id, through the repartition topic, exactly
// once while a second instance joins mid-stream and leaves (each of the
// two processors rebalanced, the counts restored on the new owner): the
// updates and the changelog end at the true count per region, while
// each instance purges the repartition topic every 200 ms
// (PurgeRepartition: nothing lost to it; what was counted is deleted).
// Inputs from a transactional producer that also aborts. Negative
// control: the same
// count kept by the derived key straight on the input partitions ends
// wrong, each partition emitting its own part of a region's count.
func TestGroupedCountIsExactThroughARebalance(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, repartition, updates := k.NewTopic(4), k.NewTopic(4), k.NewTopic(4)
	changelog := newChangelog(t, k, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	committed, _, err := integration.SeedTransactional(ctx, k.Brokers, in, 20_000, 500, func(r *kgo.Record) { r.Key = r.Value })
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, id := range committed {
		counts[regionOf(id)]++
	}
	want := map[string]string{}
	for r, n := range counts {
		want[r] = strconv.Itoa(n)
	}
	region := func(r *kgo.Record) ([]byte, error) { return []byte(regionOf(string(r.Value))), nil }
	var counted atomic.Int64
	count := eos.Count()
	paced := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		time.Sleep(200 * time.Microsecond) // so that the join lands mid-stream
		counted.Add(1)
		return count(ctx, r)
	}
	group := integration.UniqueName(t, "grouped")
	start := func(instance string) (g *eos.Grouped, stop func() error) {
		g, err := eos.NewGrouped(region, repartition, paced, append(statefulOpts(k, group, in, changelog, updates, instance),
			eos.Logger(testLogger(t)), eos.ClientOptions(testClientOpts()...), eos.PurgeRepartition(200*time.Millisecond))...)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.Run(runCtx) }()
		t.Cleanup(cancel)
		return g, func() error {
			cancel()
			select {
			case err := <-done:
				return err
			case <-time.After(time.Minute):
				t.Fatal("a grouped count did not return within a minute of its stop")
				return nil
			}
		}
	}
	a, stopA := start("0")
	waitFor(t, 2*time.Minute, "the first instance to count", func() bool { return len(a.State().Partitions()) > 0 && counted.Load() > 0 })
	b, stopB := start("1")
	waitFor(t, 2*time.Minute, "the second instance to hold partitions", func() bool { return len(b.State().Partitions()) > 0 })
	if counted.Load() >= int64(len(committed)) {
		t.Fatal("every report was counted before the second instance held a partition: no rebalance mid-stream")
	}
	if err := stopB(); err != nil {
		t.Fatalf("instance 1 stopped with %v", err)
	}
	waitForTotals(t, k, updates, want, 3*time.Minute)
	if err := stopA(); err != nil {
		t.Fatalf("instance 0 stopped with %v", err)
	}
	if got := lastValues(t, k, changelog, true); !maps.Equal(got, want) {
		t.Fatalf("the changelog ends at %v, want %v", got, want)
	}
	// The purges deleted what was counted: each partition of the
	// repartition topic starts past its first records.
	starts, err := k.Admin.ListStartOffsets(ctx, repartition)
	if err != nil {
		t.Fatal(err)
	}
	starts.Each(func(o kadm.ListedOffset) {
		if o.Offset < 100 {
			t.Errorf("partition %d of the repartition topic starts at %d: the purges deleted (nearly) nothing", o.Partition, o.Offset)
		}
	})

	// The control: by the derived key, without the repartition step.
	ctlUpdates := k.NewTopic(4)
	byRegion := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		_, err := state.Count(eos.StateOf(ctx), []byte(regionOf(string(r.Value))))
		return nil, err
	}
	ctlGroup := integration.UniqueName(t, "ungrouped")
	ctlChangelog := newChangelog(t, k, 4)
	ctl := startProcessor(t, byRegion, statefulOpts(k, ctlGroup, in, ctlChangelog, ctlUpdates, "0")...)
	// Its changelog keeps each input partition's part of each region's
	// count: done when the parts add up to every report.
	waitFor(t, 2*time.Minute, "the control to count every report", func() bool {
		parts := map[string]int64{} // "partition/region"
		for _, r := range k.ReadAll(ctlChangelog, kgo.ReadCommitted(), verifyTimeout) {
			if n, err := state.Int64(r.Value); err == nil {
				parts[strconv.Itoa(int(r.Partition))+"/"+string(r.Key)] = n
			}
		}
		var sum int64
		for _, n := range parts {
			sum += n
		}
		return sum == int64(len(committed))
	})
	if err := ctl.stop(t); err != nil {
		t.Fatalf("the control stopped with %v", err)
	}
	// A region's last update is one partition's part of its count.
	if got := lastValues(t, k, ctlUpdates, false); len(got) != len(want) || maps.Equal(got, want) {
		t.Fatalf("the control, counting by the derived key on the input's partitions, ended at %v: the test cannot tell a design without the repartition step", got)
	}
}
