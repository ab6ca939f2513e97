package eos_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/window"
)

// Cases per region per day by when each was reported, taking reports up
// to an hour late: a report of Dec 4 that comes after stream time passed
// Dec 5 01:00 is late and changes nothing. StateView.Windows reads a
// key's windows.
func ExampleWindowedCount() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "reports", "daily"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	daily := window.Tumbling(24*time.Hour, time.Hour)
	daily.Retention = 30 * 24 * time.Hour // queryable for a month
	count, err := eos.WindowedCount(daily)
	if err != nil {
		panic(err)
	}
	txnID, _ := eos.StableTransactionalID("dashboard", "0")
	p, err := eos.NewProcessor(count, eos.Brokers(brokers...), eos.Group("dashboard"),
		eos.Topics("reports"), eos.TransactionalID(txnID), eos.CommitInterval(50*time.Millisecond),
		eos.Changelog("dashboard-daily", eos.CreateChangelog(), eos.EmitUpdates("daily")),
		eos.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}

	day := func(d, h int) time.Time { return time.Date(2026, 12, d, h, 0, 0, 0, time.UTC) }
	seed, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("reports"))
	defer seed.Close()
	for _, reported := range []time.Time{day(4, 9), day(4, 17), day(5, 0), day(4, 23), day(5, 2), day(4, 22), day(5, 3)} {
		seed.Produce(context.Background(), &kgo.Record{Key: []byte("north"), Timestamp: reported}, nil)
	}
	_ = seed.Flush(context.Background())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var windows []eos.WindowValue
	for sum := 0; sum < 6; { // 7 reports, one late
		time.Sleep(10 * time.Millisecond)
		windows, _ = p.State().Windows(daily, 0, []byte("north"), day(1, 0), day(6, 0))
		sum = 0
		for _, w := range windows {
			var n int
			fmt.Sscan(string(w.Value), &n)
			sum += n
		}
	}
	cancel()
	for _, w := range windows {
		fmt.Println(w.Window.Start.Format("Jan 2"), string(w.Value))
	}
	fmt.Println(<-done)
	// Output:
	// Dec 4 3
	// Dec 5 3
	// <nil>
}

// Reports enriched with their region's name from a global table: every
// instance holds the whole table, restored before Run handles a record.
func ExampleGlobalTable() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "reports", "named"), kfake.SeedTopics(2, "regions"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	seed, _ := kgo.NewClient(kgo.SeedBrokers(brokers...))
	defer seed.Close()
	for code, name := range map[string]string{"n": "North", "s": "South"} {
		seed.Produce(context.Background(), &kgo.Record{Topic: "regions", Key: []byte(code), Value: []byte(name)}, nil)
	}
	for _, code := range []string{"n", "s", "n"} {
		seed.Produce(context.Background(), &kgo.Record{Topic: "reports", Key: []byte(code)}, nil)
	}
	_ = seed.Flush(context.Background())

	regions := eos.NewGlobalTable("regions")
	name := func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		n, _, err := regions.Get(r.Key)
		return []*kgo.Record{{Topic: "named", Key: r.Key, Value: n}}, err
	}
	txnID, _ := eos.StableTransactionalID("namer", "0")
	p, err := eos.NewProcessor(name, eos.Brokers(brokers...), eos.Group("namer"), eos.Topics("reports"),
		eos.TransactionalID(txnID), eos.CommitInterval(50*time.Millisecond), eos.WithGlobalTables(regions),
		eos.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	reader, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("named"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	defer reader.Close()
	for n := 0; n < 3; {
		reader.PollFetches(context.Background()).EachRecord(func(r *kgo.Record) {
			fmt.Println(string(r.Key), string(r.Value))
			n++
		})
	}
	cancel()
	fmt.Println(<-done)
	// Output:
	// n North
	// s South
	// n North
	// <nil>
}

// Reports joined with their region's name as of each report's time: the
// region table's partition is materialized in the report partition's
// state, and advances to each report's time before it is joined.
func ExampleJoinTable() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "reports", "regions", "named"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	seed, _ := kgo.NewClient(kgo.SeedBrokers(brokers...))
	defer seed.Close()
	noon := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	at := func(hours int) time.Time { return noon.Add(time.Duration(hours) * time.Hour) }
	// The table first: the north is renamed at 14:00.
	_ = seed.ProduceSync(context.Background(),
		&kgo.Record{Topic: "regions", Key: []byte("n"), Value: []byte("North"), Timestamp: at(0)},
		&kgo.Record{Topic: "regions", Key: []byte("n"), Value: []byte("Northern Region"), Timestamp: at(2)}).FirstErr()
	for _, hour := range []int{1, 3, 1} { // the third report is late
		seed.Produce(context.Background(), &kgo.Record{Topic: "reports", Key: []byte("n"), Timestamp: at(hour)}, nil)
	}
	seed.Produce(context.Background(), &kgo.Record{Topic: "reports", Key: []byte("w"), Timestamp: at(4)}, nil)
	_ = seed.Flush(context.Background())

	regions := eos.NewTable("regions")
	name := eos.JoinTable(regions, func(_ context.Context, r *kgo.Record, name []byte, ok bool) ([]*kgo.Record, error) {
		if !ok {
			name = []byte("unknown")
		}
		return []*kgo.Record{{Topic: "named", Key: r.Key, Value: fmt.Appendf(nil, "%s %s", r.Timestamp.UTC().Format("15:04"), name)}}, nil
	})
	txnID, _ := eos.StableTransactionalID("namer", "0")
	p, err := eos.NewProcessor(name, eos.Brokers(brokers...), eos.Group("namer"), eos.Topics("reports"),
		eos.TransactionalID(txnID), eos.CommitInterval(50*time.Millisecond), eos.Logger(slog.New(slog.DiscardHandler)),
		eos.Changelog("namer-state", eos.CreateChangelog()), eos.WithTables(regions))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()

	reader, _ := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("named"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	defer reader.Close()
	for n := 0; n < 4; {
		reader.PollFetches(context.Background()).EachRecord(func(r *kgo.Record) {
			fmt.Println(string(r.Key), string(r.Value))
			n++
		})
	}
	cancel()
	fmt.Println(<-done)
	// Output:
	// n 13:00 North
	// n 15:00 Northern Region
	// n 13:00 Northern Region
	// w 16:00 unknown
	// <nil>
}
