// Command web serves the dashboard as a live web page: the cases per
// region, in total and per day (by when each case was reported, UTC),
// counted exactly once by two eos processors (package kafkatokafka's
// totals and counts per day), from whichever instance a load balancer
// picks.
//
//	web -brokers localhost:9092 -instance web-0 -http :8080 \
//	    -endpoint http://web-0.web:8080
//
// Each instance holds some of the input's partitions (keys are spread by
// their hash), so a page that adds up what one instance holds shows
// partial totals. The page adds up every partition instead: it asks the
// instance it came from for each partition's totals and days
// (GET /api/totals/{partition} and /api/days/{partition}, JSON), and that
// instance answers its own and forwards the others to their owners
// (eos/eoshttp.Partition with Forward, the owners found from the groups'
// descriptions, each instance advertising -endpoint). Only when every
// partition answered does it show numbers; while a partition restores,
// moves in a rebalance, or its owner does not answer, the page says which
// partitions it waits for and shows no totals, never partial ones. It
// polls once a second.
//
// The JSON API, for other readers:
//
//   - GET /api/partitions: {"partitions": n}, the input's partition
//     count (503 before the processor learnt it);
//   - GET /api/totals/{p}: {"region": cases, ...} of partition p;
//   - GET /api/days/{p}: {"region": {"2026-12-01": cases, ...}, ...} of
//     partition p, the days kept (dashboard.Days: 31 days);
//   - each answers 503 (Retry-After) while p restores or its owner does
//     not answer, 421 while no owner of p is known (a rebalance), and
//     carries Eoskit-Partition (see eos/eoshttp);
//   - GET /readyz: 200 once both processors hold their partitions
//     restored (eos's Health), GET /livez: 200.
//
// -instance must be the same across restarts (a StatefulSet pod's name):
// it is the processors' static group membership (eos.InstanceID), so a
// restarted instance takes its partitions back at once, and fences its
// predecessor's transactions. The topics must exist: the reports (keyed
// by region), the totals' updates and compacted changelog, the days'
// updates and compacted changelog, each with the reports' partition
// count, and a dead-letter topic for reports that do not parse.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/patterns/kafkatokafka"
)

// Config is one instance's configuration.
type Config struct {
	Brokers []string
	// Group names the processors' groups (Group and Group+"-daily") and
	// prefixes their transactional ids.
	Group string
	// Instance is this instance's stable name.
	Instance string
	// HTTP is the address to serve on; Endpoint the URL the other
	// instances reach this one's HTTP at ("": none, and no forwarding).
	HTTP, Endpoint string
	// Listener, when not nil, is served on instead of listening on HTTP:
	// a socket handed over (systemd's socket activation, or a test's
	// that keeps its port across the instance's restarts).
	Listener net.Listener
	// Reports is the input topic; Totals and TotalsChangelog the totals'
	// updates and changelog; Days and DaysChangelog the counts per day's;
	// DeadLetters takes the reports that do not parse.
	Reports, Totals, TotalsChangelog, Days, DaysChangelog, DeadLetters string
	// Options are further processor options, given to both.
	Options []eos.ProcessorOption
}

func main() {
	cfg := Config{Brokers: []string{"localhost:9092"}}
	if err := cfg.parse(flag.CommandLine, os.Args[1:]); err != nil {
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, slog.Default()); err != nil {
		fmt.Fprintln(os.Stderr, "web:", err)
		os.Exit(1)
	}
}

// parse reads cfg from the command line args.
func (cfg *Config) parse(fs *flag.FlagSet, args []string) error {
	brokers := fs.String("brokers", strings.Join(cfg.Brokers, ","), "Kafka bootstrap addresses, comma-separated")
	fs.StringVar(&cfg.Group, "group", "dashboard", "the processors' group (and Group-daily)")
	fs.StringVar(&cfg.Instance, "instance", "", "this instance's stable name, the same across restarts; required")
	fs.StringVar(&cfg.HTTP, "http", ":8080", "address to serve the page, /api, /readyz and /livez on")
	fs.StringVar(&cfg.Endpoint, "endpoint", "", "the URL the other instances reach this one's HTTP at (default: none, and no forwarding)")
	fs.StringVar(&cfg.Reports, "reports", "case-reports", "input topic of reports keyed by region")
	fs.StringVar(&cfg.Totals, "totals", "dashboard-totals", "topic of the totals' updates")
	fs.StringVar(&cfg.TotalsChangelog, "totals-changelog", "dashboard-totals-changelog", "the totals' compacted changelog")
	fs.StringVar(&cfg.Days, "days", "dashboard-days", "topic of the counts per day's updates")
	fs.StringVar(&cfg.DaysChangelog, "days-changelog", "dashboard-days-changelog", "the counts per day's compacted changelog")
	fs.StringVar(&cfg.DeadLetters, "dead-letters", "dashboard-dead-letters", "topic of the reports that do not parse")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Brokers = strings.Split(*brokers, ",")
	return nil
}

// run runs the two processors and the HTTP server until ctx ends or one
// of them fails.
func run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if cfg.Listener != nil {
		defer cfg.Listener.Close() // closed by Shutdown too, unless run fails before serving
	}
	if cfg.Instance == "" {
		return errors.New("-instance is required: each instance's stable name")
	}
	opts := append([]eos.ProcessorOption{eos.InstanceID(cfg.Instance)}, cfg.Options...)
	if cfg.Endpoint != "" {
		opts = append(opts, eos.Endpoint(cfg.Endpoint))
	} else {
		logger.Warn("web: no -endpoint: this instance forwards no partition to its owner, and none to it, so with more than one instance its page waits for partitions for ever")
	}
	kcfg := kafkatokafka.Config{Brokers: cfg.Brokers, Group: cfg.Group, Instance: cfg.Instance, Input: cfg.Reports,
		Totals: cfg.Totals, Changelog: cfg.TotalsChangelog, Daily: cfg.Days, DailyChangelog: cfg.DaysChangelog,
		DeadLetterTopic: cfg.DeadLetters, Handler: check, Logger: logger, Options: opts}
	totals, err := kafkatokafka.New(kcfg)
	if err != nil {
		return err
	}
	days, err := kafkatokafka.NewDaily(kcfg)
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: cfg.HTTP, Handler: routes(totals, days), ReadHeaderTimeout: 5 * time.Second}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- eos.RunTogether(ctx, totals, days) }()
	go func() {
		serve, addr := srv.ListenAndServe, cfg.HTTP
		if cfg.Listener != nil {
			serve, addr = func() error { return srv.Serve(cfg.Listener) }, cfg.Listener.Addr().String()
		}
		if err := serve(); !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("serve %s: %w", addr, err)
			return
		}
		errs <- nil
	}()
	first := <-errs // the first to end ends the other
	cancel()
	shutdown, done := context.WithTimeout(context.Background(), 15*time.Second)
	defer done()
	_ = srv.Shutdown(shutdown)
	return errors.Join(first, <-errs)
}
