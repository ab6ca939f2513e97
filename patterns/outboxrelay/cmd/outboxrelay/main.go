// Command outboxrelay runs the outbox relay of the exactly-once
// PostgreSQL→Kafka pattern (package outboxrelay): the reports the intake
// service committed into the outbox, published to Kafka once each. A
// second relay started beside it stands by and takes over when it stops;
// SIGTERM or Ctrl-C exits 0.
//
// It answers Kubernetes' probes and Prometheus on -http: /livez
// (liveness: Run runs), /healthz (Run makes progress: for alerts),
// /readyz (readiness) and /metrics (package eosprom's series and the Go
// runtime's). A relay standing by is ready.
//
// The database is $DATABASE_URL's, or libpq's PG* variables' (PGHOST,
// PGPASSWORD...). Run it once with -migrate to create the outbox table,
// its publication and the database's slot, before the first report is
// written; then start it without: a start never creates a slot, so a slot
// dropped while the relay was down stops it (outbox.ErrNoSlot) rather than
// being made anew past the records it held. A second relay started beside
// it (with its own -http) stands by.
//
//	outboxrelay -migrate
//	outboxrelay -brokers kafka:9092
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
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/patterns/outboxrelay"
	"github.com/eoskit/eoskit/probe"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	httpAddr := flag.String("http", ":8080", `address of the probes (/livez, /healthz, /readyz) and metrics (/metrics), on every interface by default (the kubelet probes the pod's address); "" for none`)
	cfg := outboxrelay.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.PositionTopic, "position-topic", outbox.DefaultPositionTopic, "the relay's position topic (one partition, compacted)")
	migrate := flag.Bool("migrate", false, "create the outbox table, its publication and the slot, and exit (once, before the first report)")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The database from $DATABASE_URL, or libpq's PG* variables: never
	// a flag, which ps and -h would show with its password.
	dbURL := os.Getenv("DATABASE_URL")
	if *migrate {
		if err := migrateOnce(ctx, dbURL, cfg); err != nil {
			cfg.Logger.Error("outboxrelay: migrate", "err", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, dbURL, *httpAddr, cfg); err != nil {
		cfg.Logger.Error("outboxrelay stopped", "err", err)
		os.Exit(1)
	}
}

// migrateOnce creates what the program needs in the database.
func migrateOnce(ctx context.Context, dbURL string, cfg outboxrelay.Config) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool = pool
	return outboxrelay.Migrate(ctx, cfg)
}

func run(ctx context.Context, dbURL, httpAddr string, cfg outboxrelay.Config) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := eosprom.New(reg)
	if err != nil {
		return err
	}
	cfg.Options = append(cfg.Options, outbox.WithMetrics(metrics))
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool = pool
	r, err := outboxrelay.New(cfg)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	probe.Routes(mux, r.Health)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return probe.Serve(ctx, httpAddr, mux, r.Run)
}
