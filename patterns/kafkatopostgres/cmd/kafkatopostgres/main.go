// Command kafkatopostgres runs one instance of the exactly-once
// Kafka→PostgreSQL pattern (package kafkatopostgres): case reports in, the
// dashboard's totals in PostgreSQL. Run as many as the topic has
// partitions; SIGTERM or Ctrl-C lets the batch in hand commit and exits 0.
//
//	kafkatopostgres -brokers kafka:9092 -database-url "$DATABASE_URL"
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/patterns/kafkatopostgres"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "the dashboard's PostgreSQL")
	cfg := kafkatopostgres.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.Group, "group", "dashboard-totals", "consumer group, shared by every instance")
	flag.StringVar(&cfg.Topic, "topic", "case-reports", "topic of incoming reports")
	flag.StringVar(&cfg.Tables, "tables", "dashboard", "prefix of the dashboard's tables")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dbURL, cfg); err != nil {
		cfg.Logger.Error("kafkatopostgres stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dbURL string, cfg kafkatopostgres.Config) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool = pool
	if err := kafkatopostgres.Migrate(ctx, cfg); err != nil {
		return err
	}
	return kafkatopostgres.Run(ctx, cfg)
}
