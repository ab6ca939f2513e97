// Command dedupconsumer runs one instance of the effectively-once pattern
// (package dedupconsumer): dedup.Stamp-ed case reports in, each id counted
// once in the dashboard's totals in PostgreSQL. Run as many as the topic has
// partitions; SIGTERM or Ctrl-C lets the batch in hand commit and exits 0.
//
// It answers Kubernetes' probes and Prometheus on -http: /livez
// (liveness: Run runs), /healthz (Run makes progress: for alerts),
// /readyz (readiness) and /metrics (package eosprom's series and the Go
// runtime's). With -instance (a StatefulSet pod's name) a restarted
// instance gets its partitions back at once; with -dead-letters a report
// that cannot be applied is parked in the database, listed and replayed by
// `eoskit dead-letters`, instead of stopping the program. Ids older than
// -retention are purged at the start and every hour.
//
// The database is $DATABASE_URL's, or libpq's PG* variables' (PGHOST,
// PGPASSWORD...). Run it once with -migrate, as the role that will own the
// id table, to create it and the dashboard's tables; then start it.
//
//	dedupconsumer -migrate
//	dedupconsumer -brokers kafka:9092 -instance "$POD_NAME" -dead-letters
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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos/eosprom"
	"github.com/eoskit/eoskit/patterns/dedupconsumer"
	"github.com/eoskit/eoskit/probe"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	httpAddr := flag.String("http", ":8080", `address of the probes (/livez, /healthz, /readyz) and metrics (/metrics), on every interface by default (the kubelet probes the pod's address); "" for none`)
	cfg := dedupconsumer.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.Group, "group", "dashboard-totals-dedup", "consumer group, shared by every instance")
	flag.StringVar(&cfg.Topic, "topic", "case-reports", "topic of incoming, stamped reports")
	flag.StringVar(&cfg.Tables, "tables", "dashboard", "prefix of the dashboard's tables and of the id table")
	flag.StringVar(&cfg.Instance, "instance", "", "this instance's stable name (a StatefulSet pod's): static membership; default none")
	flag.BoolVar(&cfg.DeadLetters, "dead-letters", false, "park a report that cannot be applied in the dead-letter table instead of stopping")
	flag.DurationVar(&cfg.Retention, "retention", dedupconsumer.DefaultRetention, "how long a claimed id is kept (longer than any redelivery); negative: for ever")
	migrate := flag.Bool("migrate", false, "create the id table and the dashboard's tables, and exit (once, before the first start)")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")
	if cfg.Retention == 0 {
		fmt.Fprintln(os.Stderr, "dedupconsumer: -retention 0 would forget every id at once; give how long to keep them (negative: for ever)")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The database from $DATABASE_URL, or libpq's PG* variables: never
	// a flag, which ps and -h would show with its password.
	dbURL := os.Getenv("DATABASE_URL")
	if *migrate {
		if err := migrateOnce(ctx, dbURL, cfg); err != nil {
			cfg.Logger.Error("dedupconsumer: migrate", "err", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, dbURL, *httpAddr, cfg); err != nil {
		cfg.Logger.Error("dedupconsumer stopped", "err", err)
		os.Exit(1)
	}
}

// migrateOnce creates what the program needs in the database.
func migrateOnce(ctx context.Context, dbURL string, cfg dedupconsumer.Config) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool = pool
	return dedupconsumer.Migrate(ctx, cfg)
}

func run(ctx context.Context, dbURL, httpAddr string, cfg dedupconsumer.Config) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := eosprom.New(reg)
	if err != nil {
		return err
	}
	cfg.Options = append(cfg.Options, dedup.WithMetrics(metrics))
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool = pool
	c, err := dedupconsumer.New(cfg)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	probe.Routes(mux, c.Health)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return probe.Serve(ctx, httpAddr, mux, c.Run)
}
