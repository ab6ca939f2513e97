package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
)

// The program counts the reports per region, answers each region's total
// over HTTP, becomes ready, and keeps region_totals in PostgreSQL at the
// same totals.
func TestTheApplicationCountsServesAndCopies(t *testing.T) {
	pool, dbURL := integration.PostgresWithURL(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "case-reports", "region-totals"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("case-reports"))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	compact := "compact"
	if _, err := kadm.NewClient(seed).CreateTopic(ctx, 3, 1, map[string]*string{"cleanup.policy": &compact}, "region-totals-changelog"); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for i := range 300 {
		region := "region-" + strconv.Itoa(i%7)
		want[region]++
		seed.Produce(ctx, &kgo.Record{Key: []byte(region)}, nil)
	}
	if err := seed.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := Config{Brokers: cluster.ListenAddrs(), Database: dbURL, Instance: "app-0", HTTP: addr, Endpoint: "http://" + addr,
		Reports: "case-reports", Totals: "region-totals", Changelog: "region-totals-changelog"}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, cfg, slog.New(slog.DiscardHandler)) }()

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for {
		ready, _ := get("/readyz")
		served, copied := 0, 0
		for region, n := range want {
			if code, body := get("/state/" + region); code == http.StatusOK && body == strconv.Itoa(n) {
				served++
			}
			var total int64
			if err := pool.QueryRow(ctx, `SELECT total FROM region_totals WHERE region = $1`, region).Scan(&total); err == nil && total == int64(n) {
				copied++
			}
		}
		if ready == http.StatusOK && served == len(want) && copied == len(want) {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned %v", err)
		default:
		}
		if ctx.Err() != nil {
			stop()
			t.Fatalf("after 30 s: ready %d, %d of %d regions served right, %d copied right; run: %v", ready, served, len(want), copied, <-done)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
