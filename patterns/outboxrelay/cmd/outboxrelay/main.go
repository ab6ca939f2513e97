// Command outboxrelay runs the outbox relay of the exactly-once
// PostgreSQL→Kafka pattern (package outboxrelay): the reports the intake
// service committed into the outbox, published to Kafka once each. A
// second relay started beside it stands by and takes over when it stops;
// SIGTERM or Ctrl-C exits 0.
//
//	outboxrelay -brokers kafka:9092 -database-url "$DATABASE_URL"
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

	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/patterns/outboxrelay"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	dbURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "the PostgreSQL whose outbox is relayed")
	cfg := outboxrelay.Config{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
	flag.StringVar(&cfg.PositionTopic, "position-topic", outbox.DefaultPositionTopic, "the relay's position topic (one partition, compacted)")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dbURL, cfg); err != nil {
		cfg.Logger.Error("outboxrelay stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dbURL string, cfg outboxrelay.Config) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool = pool
	if err := outboxrelay.Migrate(ctx, cfg); err != nil {
		return err
	}
	return outboxrelay.Run(ctx, cfg)
}
