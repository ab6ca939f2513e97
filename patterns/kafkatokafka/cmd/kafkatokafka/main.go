// Command kafkatokafka runs one instance of the exactly-once Kafka→Kafka
// pattern (package kafkatokafka): case reports in, the dashboard's feed
// out, and with -totals the per-region totals kept in Kafka. Run one per
// slot, each with its own stable -instance, which is required: a name
// that stays the same across restarts, such as a StatefulSet pod's
// (kafkatokafka-0, kafkatokafka-1, ...). A host name will not do: in a
// Deployment or a plain container it changes at every restart, and with
// it the transactional id, so a restarted instance would not fence its
// predecessor and readers would stall on its open transaction. SIGTERM or
// Ctrl-C drains the batch in hand and exits 0.
//
//	# a StatefulSet's container, with POD_NAME from the downward API
//	# (env: - name: POD_NAME, valueFrom: fieldRef: fieldPath: metadata.name)
//	kafkatokafka -brokers kafka:9092 -instance "$POD_NAME"
//	kafkatokafka -brokers kafka:9092 -instance "$POD_NAME" -totals dashboard-totals -changelog dashboard-totals-changelog
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/eoskit/eoskit/patterns/kafkatokafka"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	cfg := kafkatokafka.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.Group, "group", "dashboard-feed", "consumer group, shared by every instance")
	flag.StringVar(&cfg.Instance, "instance", "", "this instance's stable name, the same across restarts (a StatefulSet pod's name); required")
	flag.StringVar(&cfg.Input, "input", "case-reports", "topic of incoming reports")
	flag.StringVar(&cfg.Output, "output", "dashboard-feed", "the dashboard's feed topic")
	flag.StringVar(&cfg.Totals, "totals", "", "topic of the per-region totals, kept in Kafka (default: none)")
	flag.StringVar(&cfg.Changelog, "changelog", "dashboard-totals-changelog", "the totals' compacted changelog, with the input's partition count (with -totals)")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")
	if cfg.Instance == "" {
		fmt.Fprintln(os.Stderr, "kafkatokafka: -instance is required: a name that stays the same across restarts, such as a StatefulSet pod's ($POD_NAME); a host name changes at every restart in a Deployment or a container, and a restarted instance would then not fence its predecessor")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := kafkatokafka.Run(ctx, cfg); err != nil {
		cfg.Logger.Error("kafkatokafka stopped", "err", err)
		os.Exit(1)
	}
}
