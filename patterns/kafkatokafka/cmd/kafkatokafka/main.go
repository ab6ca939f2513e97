// Command kafkatokafka runs one instance of the exactly-once Kafka→Kafka
// pattern (package kafkatokafka): case reports in, the dashboard's feed
// out, with -totals the per-region totals kept in Kafka, and with -daily
// or -daily-final the counts per region per day (a second processor, in
// group -group plus "-daily"; the probes answer for the worse of the
// two). Run one per
// slot, each with its own stable -instance, which is required: a name
// that stays the same across restarts, such as a StatefulSet pod's
// (kafkatokafka-0, kafkatokafka-1, ...). A host name will not do: in a
// Deployment or a plain container it changes at every restart, and with
// it the transactional id, so a restarted instance would not fence its
// predecessor and readers would stall on its open transaction. The
// instance is also the group's static membership, so that a restarted
// instance gets its partitions back at once. SIGTERM or Ctrl-C drains the
// batch in hand and exits 0.
//
// It answers Kubernetes' probes and Prometheus on -http: /livez
// (liveness: Run runs), /healthz (Run makes progress: for alerts),
// /readyz (readiness) and /metrics (package eosprom's series and the Go
// runtime's). With -dead-letter-topic a report that cannot be
// used goes to that topic, listed and replayed by `eoskit dead-letters`,
// instead of stopping the program.
//
//	# a StatefulSet's container, with POD_NAME from the downward API
//	# (env: - name: POD_NAME, valueFrom: fieldRef: fieldPath: metadata.name)
//	kafkatokafka -brokers kafka:9092 -instance "$POD_NAME"
//	kafkatokafka -brokers kafka:9092 -instance "$POD_NAME" -totals dashboard-totals -changelog dashboard-totals-changelog
//	kafkatokafka -brokers kafka:9092 -instance "$POD_NAME" -daily dashboard-days -daily-final dashboard-days-final -daily-changelog dashboard-days-changelog
//	kafkatokafka -brokers kafka:9092 -instance "$POD_NAME" -dead-letter-topic case-reports-dead-letters
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eosprom"
	"github.com/eoskit/eoskit/patterns/kafkatokafka"
	"github.com/eoskit/eoskit/probe"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	httpAddr := flag.String("http", ":8080", `address of the probes (/livez, /healthz, /readyz) and metrics (/metrics), on every interface by default (the kubelet probes the pod's address); "" for none`)
	cfg := kafkatokafka.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.Group, "group", "dashboard-feed", "consumer group, shared by every instance")
	flag.StringVar(&cfg.Instance, "instance", "", "this instance's stable name, the same across restarts (a StatefulSet pod's name); required")
	flag.StringVar(&cfg.Input, "input", "case-reports", "topic of incoming reports")
	flag.StringVar(&cfg.Output, "output", "dashboard-feed", "the dashboard's feed topic")
	flag.StringVar(&cfg.Totals, "totals", "", "topic of the per-region totals, kept in Kafka (default: none)")
	flag.StringVar(&cfg.Changelog, "changelog", "dashboard-totals-changelog", "the totals' compacted changelog, with the input's partition count (with -totals)")
	flag.StringVar(&cfg.Daily, "daily", "", "topic of the live counts per region per day, by when each case was reported (default: none)")
	flag.StringVar(&cfg.DailyFinal, "daily-final", "", "topic of each day's final count per region, published once when the day closes (default: none)")
	flag.StringVar(&cfg.DailyChangelog, "daily-changelog", "dashboard-days-changelog", "the counts per day's compacted changelog, with the input's partition count (with -daily or -daily-final)")
	flag.StringVar(&cfg.RegionNames, "region-names", "", "compacted topic of region names keyed by region code: each report on the feed carries its region's name in the header region-name (default: none)")
	flag.StringVar(&cfg.DeadLetterTopic, "dead-letter-topic", "", "topic for reports that cannot be used, instead of stopping (default: none)")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")
	if cfg.Instance == "" {
		fmt.Fprintln(os.Stderr, "kafkatokafka: -instance is required: a name that stays the same across restarts, such as a StatefulSet pod's ($POD_NAME); a host name changes at every restart in a Deployment or a container, and a restarted instance would then not fence its predecessor")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *httpAddr, cfg); err != nil {
		cfg.Logger.Error("kafkatokafka stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, httpAddr string, cfg kafkatokafka.Config) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := eosprom.New(reg)
	if err != nil {
		return err
	}
	cfg.Options = append(cfg.Options, eos.InstanceID(cfg.Instance), eos.WithMetrics(metrics))
	p, err := kafkatokafka.New(cfg)
	if err != nil {
		return err
	}
	procs := []*eos.Processor{p}
	if cfg.Daily != "" || cfg.DailyFinal != "" {
		daily, err := kafkatokafka.NewDaily(cfg)
		if err != nil {
			return err
		}
		procs = append(procs, daily)
	}
	mux := http.NewServeMux()
	probe.Routes(mux, func() eoskit.Health {
		hs := make([]eoskit.Health, len(procs))
		for i, p := range procs {
			hs[i] = p.Health()
		}
		return eoskit.Worst(hs...)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return probe.Serve(ctx, httpAddr, mux, func(ctx context.Context) error { return eos.RunTogether(ctx, procs...) })
}
