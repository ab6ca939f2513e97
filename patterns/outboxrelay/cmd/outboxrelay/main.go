// Command outboxrelay runs the outbox relay of the exactly-once
// PostgreSQL→Kafka pattern (package outboxrelay): the reports the intake
// service committed into the outbox, published to Kafka once each. A
// second relay started beside it stands by and takes over when it stops;
// SIGTERM or Ctrl-C exits 0.
//
// It answers Kubernetes' probes and Prometheus on -http: /healthz
// (liveness), /readyz (readiness: a relay standing by is ready) and
// /metrics (package eosprom's series and the Go runtime's).
//
//	outboxrelay -brokers kafka:9092 -database-url "$DATABASE_URL"
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
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "the PostgreSQL whose outbox is relayed")
	httpAddr := flag.String("http", ":8080", `address of the probes (/healthz, /readyz) and metrics (/metrics); "" for none`)
	cfg := outboxrelay.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.PositionTopic, "position-topic", outbox.DefaultPositionTopic, "the relay's position topic (one partition, compacted)")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dbURL, *httpAddr, cfg); err != nil {
		cfg.Logger.Error("outboxrelay stopped", "err", err)
		os.Exit(1)
	}
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
	return probe.Serve(ctx, httpAddr, mux, func(ctx context.Context) error {
		if err := outboxrelay.Migrate(ctx, cfg); err != nil {
			return err
		}
		return r.Run(ctx)
	})
}
