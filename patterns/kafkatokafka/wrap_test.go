package kafkatokafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/kafkatokafka"
)

// Config.Wrap wraps the handler of both processors Run runs, the feed's
// and the daily counts', each named by its group: each wrapper meets
// every report.
func TestWrapWrapsEachProcessorsHandler(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "case-reports", "dashboard-feed", "dashboard-days"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	compact := "compact"
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &compact}, "dashboard-days-changelog"); err != nil {
		t.Fatal(err)
	}
	const reports = 5
	for i := range reports {
		r := dashboard.Report{ID: string(rune('a' + i)), Region: "north", Cases: 1, ReportedAt: time.Date(2026, 12, 1, i, 0, 0, 0, time.UTC)}
		if err := cl.ProduceSync(ctx, r.Record("case-reports")).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]map[string]bool{} // per wrapper's group, the reports its handler met
	wrap := func(group string, h eos.HandlerFunc) eos.HandlerFunc {
		mu.Lock()
		defer mu.Unlock()
		met := map[string]bool{}
		seen[group] = met
		return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			mu.Lock()
			met[string(r.Value)] = true
			mu.Unlock()
			return h(ctx, r)
		}
	}
	cfg := kafkatokafka.Config{Brokers: brokers, Group: "dashboard", Instance: "0", Input: "case-reports", Output: "dashboard-feed",
		Daily: "dashboard-days", DailyChangelog: "dashboard-days-changelog", Wrap: wrap,
		Logger: slog.New(slog.DiscardHandler), Options: []eos.ProcessorOption{eos.CommitInterval(20 * time.Millisecond)}}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- kafkatokafka.Run(runCtx, cfg) }()
	for {
		mu.Lock()
		all := len(seen) == 2 && len(seen["dashboard"]) == reports && len(seen["dashboard-daily"]) == reports
		met := fmt.Sprint(seen)
		mu.Unlock()
		if all {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned %v; the wrappers met %s", err, met)
		case <-ctx.Done():
			t.Fatalf("the wrappers met %s; want two, dashboard and dashboard-daily, each meeting the %d reports", met, reports)
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of its ctx's end")
	}
}
