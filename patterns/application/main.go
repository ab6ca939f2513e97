// Command application is the complete program docs/build-your-application.md
// walks through: an exactly-once count of case reports per region
// (eos.Processor with keyed state), served over HTTP from whichever
// instance is asked (eos/eoshttp, forwarding to the key's owner), with a
// readiness probe that stays false while partitions restore, and a copy of
// the totals in PostgreSQL kept exactly in step (offsetstore reading the
// processor's updates topic, the copy and its offsets in one database
// transaction).
//
//	application -brokers localhost:9092 -database postgres://... \
//	    -instance app-0 -http :8080 -endpoint http://10.0.0.5:8080
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eoshttp"
	"github.com/eoskit/eoskit/offsetstore"
)

// Config is one instance's configuration.
type Config struct {
	Brokers  []string
	Database string // a PostgreSQL URL
	// Instance is this instance's stable name (a StatefulSet pod's): its
	// transactional id and static group membership.
	Instance string
	// HTTP is the address to serve on; Endpoint the URL the other
	// instances reach this one at (it must serve HTTP's handlers).
	HTTP, Endpoint string
	// Reports is the input topic (keyed by region), Totals the updates
	// topic, Changelog the count's compacted changelog (the input's
	// partition count).
	Reports, Totals, Changelog string
}

func main() {
	var cfg Config
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap addresses, comma-separated")
	flag.StringVar(&cfg.Database, "database", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default: $DATABASE_URL)")
	flag.StringVar(&cfg.Instance, "instance", "", "this instance's stable name, the same across restarts; required")
	flag.StringVar(&cfg.HTTP, "http", ":8080", "address to serve /state/{region}, /readyz and /livez on")
	flag.StringVar(&cfg.Endpoint, "endpoint", "", "the URL the other instances reach this one's HTTP at, by a name that outlives the pod's address (default: none, and no forwarding to or from this instance)")
	flag.StringVar(&cfg.Reports, "reports", "case-reports", "input topic of reports keyed by region")
	flag.StringVar(&cfg.Totals, "totals", "region-totals", "topic of the totals' updates")
	flag.StringVar(&cfg.Changelog, "changelog", "region-totals-changelog", "the count's compacted changelog")
	flag.Parse()
	cfg.Brokers = strings.Split(*brokers, ",")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, slog.Default()); err != nil {
		fmt.Fprintln(os.Stderr, "application:", err)
		os.Exit(1)
	}
}

// run runs the count, its HTTP handlers and the PostgreSQL copy until ctx
// ends or one of them fails.
func run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	if cfg.Instance == "" {
		return errors.New("-instance is required: each instance's stable name")
	}
	txnID, err := eos.StableTransactionalID("region-totals", cfg.Instance)
	if err != nil {
		return err
	}
	opts := []eos.ProcessorOption{eos.Brokers(cfg.Brokers...), eos.Group("region-totals"), eos.Topics(cfg.Reports),
		eos.TransactionalID(txnID), eos.InstanceID(cfg.Instance), eos.Logger(logger),
		eos.Changelog(cfg.Changelog, eos.EmitUpdates(cfg.Totals))}
	if cfg.Endpoint != "" {
		opts = append(opts, eos.Endpoint(cfg.Endpoint))
	}
	count, err := eos.NewProcessor(eos.Count(), opts...)
	if err != nil {
		return err
	}

	pool, err := pgxpool.New(ctx, cfg.Database)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return err
	}
	// The copy reads the updates topic (read_committed, as offsetstore
	// always does): each record is a region's total as a committed
	// transaction left it, so the table follows Kafka's totals exactly,
	// and the offsets commit with the rows.
	copier, err := offsetstore.NewRunner(pool, copyTotals, offsetstore.Brokers(cfg.Brokers...),
		offsetstore.Group("region-totals-copy"), offsetstore.Topics(cfg.Totals), offsetstore.Logger(logger),
		// A total PostgreSQL refuses (a region key that is no text)
		// waits in the dead-letter table rather than stop the service.
		offsetstore.OnHandlerError(offsetstore.DeadLetter()))
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /state/{key...}", eoshttp.Handler(count, eoshttp.Forward(nil)))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !count.Health().Ready() || !copier.Health().Ready() {
			http.Error(w, "not ready (restoring, or waiting for the group)", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	srv := &http.Server{Addr: cfg.HTTP, Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 3)
	go func() { errs <- count.Run(ctx) }()
	go func() { errs <- copier.Run(ctx) }()
	go func() {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			errs <- err
			return
		}
		errs <- nil
	}()
	first := <-errs // the first to end ends the others
	cancel()
	shutdown, done := context.WithTimeout(context.Background(), 15*time.Second)
	defer done()
	_ = srv.Shutdown(shutdown)
	return errors.Join(first, <-errs, <-errs)
}

// migrate creates the offsets' table and the totals' table.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := offsetstore.Migrate(ctx, pool); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS region_totals (region text PRIMARY KEY, total bigint NOT NULL)`)
	return err
}

// copyTotals writes each region's latest total in the batch's
// transaction (a tombstone deletes the region).
func copyTotals(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
	for _, r := range recs {
		var err error
		if r.Value == nil {
			_, err = tx.Exec(ctx, `DELETE FROM region_totals WHERE region = $1`, string(r.Key))
		} else {
			_, err = tx.Exec(ctx, `INSERT INTO region_totals (region, total) VALUES ($1, $2::text::bigint)
				ON CONFLICT (region) DO UPDATE SET total = EXCLUDED.total`, string(r.Key), string(r.Value))
		}
		if err != nil {
			return err
		}
	}
	return nil
}
