// Command kafkatokafka runs one instance of the exactly-once Kafka→Kafka
// pattern (package kafkatokafka): case reports in, the dashboard's feed
// out, and with -totals the per-region totals kept in Kafka. Run one per
// slot, each with its own stable -instance; SIGTERM or Ctrl-C drains the
// batch in hand and exits 0.
//
//	kafkatokafka -brokers kafka:9092 -instance "$POD_NAME"
//	kafkatokafka -brokers kafka:9092 -instance "$POD_NAME" -totals dashboard-totals -changelog dashboard-totals-changelog
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/eoskit/eoskit/patterns/kafkatokafka"
)

func main() {
	host, _ := os.Hostname()
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	cfg := kafkatokafka.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.Group, "group", "dashboard-feed", "consumer group, shared by every instance")
	flag.StringVar(&cfg.Instance, "instance", host, "this instance's stable name (a StatefulSet pod name)")
	flag.StringVar(&cfg.Input, "input", "case-reports", "topic of incoming reports")
	flag.StringVar(&cfg.Output, "output", "dashboard-feed", "the dashboard's feed topic")
	flag.StringVar(&cfg.Totals, "totals", "", "topic of the per-region totals, kept in Kafka (default: none)")
	flag.StringVar(&cfg.Changelog, "changelog", "dashboard-totals-changelog", "the totals' compacted changelog, with the input's partition count (with -totals)")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := kafkatokafka.Run(ctx, cfg); err != nil {
		cfg.Logger.Error("kafkatokafka stopped", "err", err)
		os.Exit(1)
	}
}
