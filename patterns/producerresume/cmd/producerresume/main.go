// Command producerresume is one region's source of case reports (package
// producerresume): it reads reports from stdin, one "id|region|cases" (or
// "id|region|cases|reported_at") a line in a fixed order, and writes each once to its partition, the only
// writer there. Started again after a crash, with the same input, it goes
// on after the last report the partition holds. SIGTERM or Ctrl-C stops it
// between two reports.
//
//	producerresume -brokers kafka:9092 -partition 0 < north-reports.txt
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/producerresume"
)

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	var cfg producerresume.Config
	flag.StringVar(&cfg.Topic, "topic", "case-reports", "topic to write to")
	partition := flag.Int("partition", 0, "this source's partition, which nothing else writes")
	flag.Parse()
	cfg.Brokers, cfg.Partition = strings.Split(*brokers, ","), int32(*partition)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		logger.Error("producerresume stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg producerresume.Config) error {
	p, err := producerresume.New(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	last, err := p.Last(ctx)
	if err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	skipping := last != "" // up to and including the last report written
	for in.Scan() && ctx.Err() == nil {
		rep, err := dashboard.Parse(in.Bytes())
		if err != nil {
			return err
		}
		if skipping {
			skipping = rep.ID != last
			continue
		}
		if err := p.Send(ctx, rep); err != nil {
			return err
		}
	}
	if err := in.Err(); err != nil {
		return err
	}
	if skipping {
		return fmt.Errorf("the partition's last report, %s, is not in the input", last)
	}
	return nil
}
