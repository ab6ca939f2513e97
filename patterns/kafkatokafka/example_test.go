package kafkatokafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/kafkatokafka"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/window"
)

// The handler alone, without a broker: one report in, the same report out
// on the feed topic, keyed by its region.
func ExampleForward() {
	out, err := kafkatokafka.Forward("dashboard-feed")(context.Background(), &kgo.Record{Value: []byte("r7|north|4")})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s key=%s value=%s\n", out[0].Topic, out[0].Key, out[0].Value)
	// Output: dashboard-feed key=north value=r7|north|4
}

// The pattern with the dashboard's totals kept in Kafka, on franz-go's
// in-process fake cluster (kfake) so that it needs no broker: three
// reports in, and the dashboard reading each region's last total,
// read_committed. The guarantee is proven on a real broker by cmd/eoslab
// and the eos tests, not by this.
func ExampleRun_totals() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "case-reports", "dashboard-feed", "dashboard-totals"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The changelog: compacted, with the input's partition count.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("case-reports"))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	compact := "compact"
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &compact}, "dashboard-totals-changelog"); err != nil {
		panic(err)
	}
	for _, r := range []dashboard.Report{{ID: "r1", Region: "north", Cases: 4}, {ID: "r2", Region: "south", Cases: 2}, {ID: "r3", Region: "north", Cases: 3}} {
		if err := cl.ProduceSync(ctx, r.Record("case-reports")).FirstErr(); err != nil {
			panic(err)
		}
	}

	cfg := kafkatokafka.Config{Brokers: brokers, Group: "dashboard", Instance: "0",
		Input: "case-reports", Output: "dashboard-feed", Totals: "dashboard-totals", Changelog: "dashboard-totals-changelog",
		Logger: slog.New(slog.DiscardHandler), Options: []eos.ProcessorOption{eos.CommitInterval(50 * time.Millisecond)}}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- kafkatokafka.Run(runCtx, cfg) }()

	// The dashboard: each region's last total, read_committed.
	reader, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("dashboard-totals"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		panic(err)
	}
	defer reader.Close()
	totals := map[string]int64{}
	for (totals["north"] != 7 || totals["south"] != 2) && ctx.Err() == nil {
		reader.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			totals[string(r.Key)], _ = state.Int64(r.Value)
		})
	}
	stop()
	fmt.Println("north", totals["north"], "south", totals["south"], <-done)
	// Output: north 7 south 2 <nil>
}

// The counts per region per day, on kfake: a report of 1 December; one
// of the 2nd at 00:30; one of the 1st at 23:00 coming after it (counted
// in the 1st: the day takes reports for an hour past its end); one of the
// 2nd at 01:00, which closes the 1st; and one of the 1st, too late to
// change it. The dashboard reads the 1st's final count, published once.
func ExampleRun_days() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "case-reports", "dashboard-feed", "dashboard-days-final"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	compact := "compact"
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &compact}, "dashboard-days-changelog"); err != nil {
		panic(err)
	}
	dec1 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, r := range []dashboard.Report{
		{ID: "r1", Region: "north", Cases: 4, ReportedAt: dec1.Add(9 * time.Hour)},
		{ID: "r2", Region: "north", Cases: 2, ReportedAt: dec1.Add(24*time.Hour + 30*time.Minute)},
		{ID: "r3", Region: "north", Cases: 3, ReportedAt: dec1.Add(23 * time.Hour)}, // within the 1st's grace
		{ID: "r4", Region: "north", Cases: 1, ReportedAt: dec1.Add(25 * time.Hour)}, // the 1st closes at 01:00
		{ID: "r5", Region: "north", Cases: 5, ReportedAt: dec1.Add(12 * time.Hour)}, // late
	} {
		if err := cl.ProduceSync(ctx, r.Record("case-reports")).FirstErr(); err != nil {
			panic(err)
		}
	}

	cfg := kafkatokafka.Config{Brokers: brokers, Group: "dashboard", Instance: "0",
		Input: "case-reports", Output: "dashboard-feed",
		DailyFinal: "dashboard-days-final", DailyChangelog: "dashboard-days-changelog",
		Logger: slog.New(slog.DiscardHandler), Options: []eos.ProcessorOption{eos.CommitInterval(50 * time.Millisecond)}}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- kafkatokafka.Run(runCtx, cfg) }()

	reader, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("dashboard-days-final"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		panic(err)
	}
	defer reader.Close()
	for final := false; !final && ctx.Err() == nil; {
		reader.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			region, day, _ := window.SplitKey(r.Key)
			cases, _ := state.Int64(r.Value)
			fmt.Println(string(region), day.UTC().Format(time.DateOnly), cases)
			final = true
		})
	}
	stop()
	fmt.Println(<-done)
	// Output:
	// north 2026-12-01 7
	// <nil>
}

// Region names from a table: the feed's reports carry their region's
// name, looked up in a small compacted topic held whole on every
// instance (restored before the first report).
func ExampleRun_names() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "case-reports", "dashboard-feed", "regions"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Topic: "regions", Key: []byte("north"), Value: []byte("Northern Region")},
		dashboard.Report{ID: "r1", Region: "north", Cases: 4}.Record("case-reports"),
		dashboard.Report{ID: "r2", Region: "atlantis", Cases: 1}.Record("case-reports"),
	).FirstErr(); err != nil {
		panic(err)
	}
	cfg := kafkatokafka.Config{Brokers: brokers, Group: "dashboard", Instance: "0",
		Input: "case-reports", Output: "dashboard-feed", RegionNames: "regions",
		Logger: slog.New(slog.DiscardHandler), Options: []eos.ProcessorOption{eos.CommitInterval(50 * time.Millisecond)}}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- kafkatokafka.Run(runCtx, cfg) }()

	reader, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("dashboard-feed"),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		panic(err)
	}
	defer reader.Close()
	for seen := 0; seen < 2 && ctx.Err() == nil; {
		reader.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			name := "(no name)"
			for _, h := range r.Headers {
				if h.Key == kafkatokafka.RegionNameHeader {
					name = string(h.Value)
				}
			}
			fmt.Printf("%s: %s\n", r.Value, name)
			seen++
		})
	}
	stop()
	fmt.Println(<-done)
	// Output:
	// r1|north|4: Northern Region
	// r2|atlantis|1: (no name)
	// <nil>
}
