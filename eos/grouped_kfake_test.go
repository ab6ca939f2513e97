package eos_test

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// regionOfValue is the grouping key of the grouped tests: the record's
// value, its region; an empty value has none.
func regionOfValue(r *kgo.Record) ([]byte, error) {
	if len(r.Value) == 0 {
		return nil, errors.New("no region")
	}
	return r.Value, nil
}

// groupedCluster is a kfake cluster with the grouped tests' topics, three
// partitions each.
func groupedCluster(t *testing.T) []string {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "reports", "by-region", "counts", "dead-letters"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	return cluster.ListenAddrs()
}

// reportsClient is a client of brokers producing to "reports" (the kfake
// tests' input), closed when t ends.
func reportsClient(t *testing.T, brokers []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("reports"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func groupedOpts(t *testing.T, brokers []string) []eos.ProcessorOption {
	return []eos.ProcessorOption{eos.Brokers(brokers...), eos.Group("grouped"), eos.Topics("reports"), eos.TransactionalID("grouped-0"),
		eos.CommitInterval(20 * time.Millisecond), eos.Logger(testLogger(t)),
		eos.OnHandlerError(eos.DeadLetter("dead-letters")),
		eos.Changelog("grouped-changelog", eos.CreateChangelog(), eos.EmitUpdates("counts"))}
}

// Reports keyed by their id, spread over three partitions, counted by
// region (their value) through the repartition topic: each region's count
// is whole, though its reports came from every partition; a report with
// no region is dead-lettered by the re-keying processor, the record's
// fault, and counted nowhere.
func TestGroupedCountsByADerivedKey(t *testing.T) {
	t.Parallel()
	brokers := groupedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed := reportsClient(t, brokers)
	want := map[string]string{}
	counts := map[string]int{}
	for i := range 300 {
		region := []string{"north", "south", "east", "west", ""}[i%5]
		if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte("r-" + strconv.Itoa(i)), Value: []byte(region)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if region != "" {
			counts[region]++
		}
	}
	for r, n := range counts {
		want[r] = strconv.Itoa(n)
	}
	g, err := eos.NewGrouped(regionOfValue, "by-region", eos.Count(), groupedOpts(t, brokers)...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(runCtx) }()
	got := map[string]string{}
	for !maps.Equal(got, want) && ctx.Err() == nil {
		for _, r := range readCommitted(t, brokers, "counts") {
			got[string(r.Key)] = string(r.Value)
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := len(readCommitted(t, brokers, "dead-letters")); n != 60 {
		t.Fatalf("%d reports dead-lettered, want the 60 without a region", n)
	}
	// Each region's count comes from one partition of the updates.
	partitions := map[string]map[int32]bool{}
	for _, r := range readCommitted(t, brokers, "counts") {
		if partitions[string(r.Key)] == nil {
			partitions[string(r.Key)] = map[int32]bool{}
		}
		partitions[string(r.Key)][r.Partition] = true
	}
	for region, ps := range partitions {
		if len(ps) != 1 {
			t.Errorf("region %s counted in partitions %v: in parts", region, ps)
		}
	}
}

// A record in the repartition topic that its key does not belong in (as
// after partitions were added, or another writer wrote there) ends Run
// with a *eoskit.ConfigError naming it: counting it would split its key's
// count. NewGrouped refuses a missing key function, repartition topic or
// changelog, and a repartition topic that is the input.
func TestGroupedRefusesWhatWouldSplitAKey(t *testing.T) {
	t.Parallel()
	brokers := groupedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// "north" hashes to one partition of three: write it to another.
	right := kgo.StickyKeyPartitioner(nil).ForTopic("by-region").Partition(&kgo.Record{Key: []byte("north")}, 3)
	wrong := int32((right + 1) % 3)
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "by-region", Partition: wrong, Key: []byte("north"), Value: []byte("north")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	g, err := eos.NewGrouped(regionOfValue, "by-region", eos.Count(), groupedOpts(t, brokers)...)
	if err != nil {
		t.Fatal(err)
	}
	var ce *eoskit.ConfigError
	if err := g.Run(ctx); !errors.As(err, &ce) || ce.Setting != "RequireKeyPartitioning" {
		t.Fatalf("Run: %v; want a *eoskit.ConfigError naming RequireKeyPartitioning", err)
	}
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, "dead-letters")
	if err != nil {
		t.Fatal(err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset != 0 {
			t.Errorf("dead-letters[%d] holds %d records: the misplaced record is no record's fault", o.Partition, o.Offset)
		}
	})

	base := groupedOpts(t, brokers)
	for name, build := range map[string]func() (*eos.Grouped, error){
		"no key":         func() (*eos.Grouped, error) { return eos.NewGrouped(nil, "by-region", eos.Count(), base...) },
		"no repartition": func() (*eos.Grouped, error) { return eos.NewGrouped(regionOfValue, "", eos.Count(), base...) },
		"repartition in": func() (*eos.Grouped, error) { return eos.NewGrouped(regionOfValue, "reports", eos.Count(), base...) },
		"no changelog": func() (*eos.Grouped, error) {
			return eos.NewGrouped(regionOfValue, "by-region", eos.Count(), base[:len(base)-1]...)
		},
		"round robin": func() (*eos.Grouped, error) {
			return eos.NewGrouped(regionOfValue, "by-region", eos.Count(), append(base, eos.ClientOptions(kgo.RecordPartitioner(kgo.RoundRobinPartitioner())))...)
		},
		"manual": func() (*eos.Grouped, error) {
			return eos.NewGrouped(regionOfValue, "by-region", eos.Count(), append(base, eos.ClientOptions(kgo.RecordPartitioner(kgo.ManualPartitioner())))...)
		},
		"updates to the input": func() (*eos.Grouped, error) {
			return eos.NewGrouped(regionOfValue, "by-region", eos.Count(), append(base, eos.Changelog("grouped-changelog", eos.EmitUpdates("reports")))...)
		},
		"RequireKeyPartitioning": func() (*eos.Grouped, error) {
			return eos.NewGrouped(regionOfValue, "by-region", eos.Count(), append(base, eos.RequireKeyPartitioning(kgo.StickyKeyPartitioner(nil)))...)
		},
	} {
		if _, err := build(); !errors.As(err, &ce) {
			t.Errorf("%s: %v; want a *eoskit.ConfigError", name, err)
		}
	}
}

// RunTogether ends the others when one processor returns, and reports
// each one's error in order: here the first's handler meets a
// configuration error at its first record, and the second, idle, ends
// without one.
func TestRunTogetherEndsTheOthersAndSaysWhoFailed(t *testing.T) {
	brokers := groupedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed := reportsClient(t, brokers)
	if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte("a")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	refuse := func(context.Context, *kgo.Record) ([]*kgo.Record, error) {
		return nil, &eoskit.ConfigError{Package: "test", Setting: "x", Reason: "refused"}
	}
	failing, err := eos.NewProcessor(refuse, eos.Brokers(brokers...), eos.Group("a"), eos.Topics("reports"), eos.TransactionalID("a"),
		eos.Logger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	idle, err := eos.NewProcessor(copyHandler("counts"), eos.Brokers(brokers...), eos.Group("b"), eos.Topics("by-region"), eos.TransactionalID("b"),
		eos.Logger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	err = eos.RunTogether(ctx, failing, idle)
	var te *eos.TogetherError
	var ce *eoskit.ConfigError
	if !errors.As(err, &te) || len(te.Errs) != 2 || !errors.As(te.Errs[0], &ce) || te.Errs[1] != nil || ctx.Err() != nil {
		t.Fatalf("RunTogether: %v; want a *TogetherError with the first's ConfigError and nothing from the second, before the deadline", err)
	}
	// The message names the one that failed by its group.
	if want := "processor 0 (group a): " + ce.Error(); err.Error() != want {
		t.Fatalf("RunTogether's error reads %q; want %q", err, want)
	}
}

// A compacted repartition topic would compact a key's records away before
// they are counted: Run refuses it at once.
func TestGroupedRefusesACompactedRepartitionTopic(t *testing.T) {
	brokers := groupedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	compact := "compact"
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 3, 1, map[string]*string{"cleanup.policy": &compact}, "compacted"); err != nil {
		t.Fatal(err)
	}
	g, err := eos.NewGrouped(regionOfValue, "compacted", eos.Count(), groupedOpts(t, brokers)...)
	if err != nil {
		t.Fatal(err)
	}
	var ce *eoskit.ConfigError
	if err := g.Run(ctx); !errors.As(err, &ce) || !strings.Contains(ce.Reason, "compacted") || ctx.Err() != nil {
		t.Fatalf("Run: %v; want a *eoskit.ConfigError naming the compacted repartition topic, at once", err)
	}
}
