// Command kafkatopostgres runs one instance of the exactly-once
// Kafka→PostgreSQL pattern (package kafkatopostgres): case reports in, the
// dashboard's totals in PostgreSQL. Run as many as the topic has
// partitions; SIGTERM or Ctrl-C lets the batch in hand commit and exits 0.
//
// It answers Kubernetes' probes and Prometheus on -http: /livez
// (liveness: Run runs), /healthz (Run makes progress: for alerts),
// /readyz (readiness) and /metrics (package eosprom's series and the Go
// runtime's). With -instance (a StatefulSet pod's name) a restarted
// instance gets its partitions back at once; with -dead-letters a report
// that cannot be applied is parked in the database, listed and replayed by
// `eoskit dead-letters`, instead of stopping the program.
//
// The database is $DATABASE_URL's, or libpq's PG* variables' (PGHOST,
// PGPASSWORD...). Run it once with -migrate, as a role that may create
// tables, to create the offsets' and the dashboard's tables; then start it
// without, as a role that may write them.
//
//	kafkatopostgres -migrate
//	kafkatopostgres -brokers kafka:9092 -instance "$POD_NAME" -dead-letters
package main

import (
	"context"
	"flag"
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

	"github.com/eoskit/eoskit/eos/eosprom"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/patterns/kafkatopostgres"
	"github.com/eoskit/eoskit/probe"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	httpAddr := flag.String("http", ":8080", `address of the probes (/livez, /healthz, /readyz) and metrics (/metrics), on every interface by default (the kubelet probes the pod's address); "" for none`)
	cfg := kafkatopostgres.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.Group, "group", "dashboard-totals", "consumer group, shared by every instance")
	flag.StringVar(&cfg.Topic, "topic", "case-reports", "topic of incoming reports")
	flag.StringVar(&cfg.Tables, "tables", "dashboard", "prefix of the dashboard's tables")
	flag.StringVar(&cfg.Instance, "instance", "", "this instance's stable name (a StatefulSet pod's): static membership; default none")
	flag.BoolVar(&cfg.DeadLetters, "dead-letters", false, "park a report that cannot be applied in the dead-letter table instead of stopping")
	migrate := flag.Bool("migrate", false, "create the offsets' and the dashboard's tables, and exit (once, before the first start)")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The database from $DATABASE_URL, or libpq's PG* variables: never
	// a flag, which ps and -h would show with its password.
	dbURL := os.Getenv("DATABASE_URL")
	if *migrate {
		if err := migrateOnce(ctx, dbURL, cfg); err != nil {
			cfg.Logger.Error("kafkatopostgres: migrate", "err", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, dbURL, *httpAddr, cfg); err != nil {
		cfg.Logger.Error("kafkatopostgres stopped", "err", err)
		os.Exit(1)
	}
}

// migrateOnce creates what the program needs in the database.
func migrateOnce(ctx context.Context, dbURL string, cfg kafkatopostgres.Config) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool = pool
	return kafkatopostgres.Migrate(ctx, cfg)
}

func run(ctx context.Context, dbURL, httpAddr string, cfg kafkatopostgres.Config) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := eosprom.New(reg)
	if err != nil {
		return err
	}
	cfg.Options = append(cfg.Options, offsetstore.WithMetrics(metrics))
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool = pool
	r, err := kafkatopostgres.New(cfg)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	probe.Routes(mux, r.Health)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return probe.Serve(ctx, httpAddr, mux, r.Run)
}
