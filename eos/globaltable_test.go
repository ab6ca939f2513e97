package eos_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// writeRegionNames commits a name for each of the regions to table, from
// a transactional producer that then writes "WRONG" for each in a
// transaction it aborts (a reader of uncommitted records would end at
// those), and returns when both ended.
func writeRegionNames(t *testing.T, k *integration.KafkaCluster, table, version string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(append(testClientOpts(), kgo.SeedBrokers(k.Brokers...), kgo.DefaultProduceTopic(table),
		kgo.TransactionalID(integration.UniqueName(t, "names")))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, commit := range []bool{true, false} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range regions {
			region := regionOf("in-" + strconv.Itoa(i))
			name := "WRONG"
			if commit {
				name = strings.ToUpper(region) + " " + version
			}
			if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(region), Value: []byte(name)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
}

// A global table of region names, written by a transactional producer
// that also aborts, over three partitions: a processor enriching reports
// with their region's name finds every name from its first record (the
// table restored before Run handles one; a lookup that missed would stop
// Run), none of an aborted transaction; names committed while it runs
// reach the records read after the table's next refresh. A missing
// table, and a table given to two processors running at once, are
// ConfigErrors from Run within seconds.
func TestGlobalTableIsRestoredFirstAndKeptCurrent(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	table := newChangelog(t, k, 3)
	writeRegionNames(t, k, table, "v1")
	in, out := k.NewTopic(4), k.NewTopic(4)
	seed := func(phase string, n int) int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		committed, _, err := integration.SeedTransactional(ctx, k.Brokers, in, n, 100, func(r *kgo.Record) {
			r.Key = []byte(regionOf(string(r.Value)))
			r.Value = []byte(phase + "-" + string(r.Value))
		})
		if err != nil {
			t.Fatal(err)
		}
		return len(committed)
	}
	first := seed("first", 2000)
	names := eos.NewGlobalTable(table, eos.RefreshInterval(200*time.Millisecond))
	enrich := func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		name, ok, err := names.Get(r.Key)
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, errors.New("no name for region " + string(r.Key))
		}
		return []*kgo.Record{{Topic: out, Key: r.Key, Value: append(append(append([]byte{}, r.Value...), '|'), name...)}}, nil
	}
	group := integration.UniqueName(t, "g")
	run := startProcessor(t, enrich, append(processorOpts(k, group, in, "0"), eos.WithGlobalTables(names))...)

	waitFor(t, time.Minute, "the table's restore", func() bool { return !names.Refreshed().IsZero() })
	// Another processor may not share the table while it runs.
	other, err := eos.NewProcessor(enrich, append(processorOpts(k, group+"-other", in, "0"), eos.WithGlobalTables(names))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cfg *eoskit.ConfigError
	if err := other.Run(ctx); !errors.As(err, &cfg) || cfg.Setting != "WithGlobalTables" {
		t.Fatalf("a second Run on the table returned %v; want a ConfigError naming WithGlobalTables", err)
	}

	// checkNames waits for want enriched reports and checks each carries
	// its region's name of the version its phase was read under.
	checkNames := func(want int, versions map[string]string) {
		t.Helper()
		var recs []*kgo.Record
		waitFor(t, 2*time.Minute, "the enriched reports", func() bool {
			recs = k.ReadAll(out, kgo.ReadCommitted(), 10*time.Second)
			return len(recs) >= want
		})
		for _, r := range recs {
			phase, _, _ := strings.Cut(string(r.Value), "-")
			if !strings.HasSuffix(string(r.Value), "|"+strings.ToUpper(string(r.Key))+" "+versions[phase]) {
				t.Fatalf("report %q of %s carries the wrong name; want version %s", r.Value, r.Key, versions[phase])
			}
		}
	}
	checkNames(first, map[string]string{"first": "v1"})

	before := names.Refreshed()
	writeRegionNames(t, k, table, "v2")
	committed := time.Now()
	waitFor(t, time.Minute, "a refresh after the new names", func() bool { return names.Refreshed().After(committed) })
	if !names.Refreshed().After(before) {
		t.Fatal("no refresh")
	}
	second := seed("second", 500)
	checkNames(first+second, map[string]string{"first": "v1", "second": "v2"})
	if err := run.stop(t); err != nil {
		t.Fatalf("Run returned %v", err)
	}

	missing := eos.NewGlobalTable("no-such-table-" + group)
	p, err := eos.NewProcessor(enrich, append(processorOpts(k, group+"-missing", in, "0"), eos.WithGlobalTables(missing))...)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.Run(ctx); !errors.As(err, &cfg) || !strings.Contains(err.Error(), "does not exist") || time.Since(start) > 20*time.Second {
		t.Fatalf("with a missing table Run returned %v after %s; want a ConfigError within seconds", err, time.Since(start))
	}
}
