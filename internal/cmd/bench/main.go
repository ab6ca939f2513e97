// Command bench measures what each of eoskit's guarantees costs, side by
// side in one run on one broker and one PostgreSQL, and prints one markdown
// table: records per second, p50 and p99 end-to-end latency and peak heap
// for every variant, each as a ratio to its path's at-least-once baseline.
//
//	KAFKA_BROKERS=... DATABASE_URL=... go run ./internal/cmd/bench [-sizes 100,1024] [-runs 3] [-only offsetstore]
//
// The paths and their baselines:
//
//   - eos: eos.Processor at commit intervals 10 ms, 100 ms and 1 s, against
//     the same Processor under AtLeastOnce (the at-least-once
//     consume-produce loop) and a raw franz-go GroupTransactSession, with
//     the broker's physical reference (an idempotent producer seeding, and
//     a plain consumer reading, the same records);
//   - offsetstore: the Runner at batches of 100, 1,000 and 10,000 against a
//     consumer making the same COPY per batch with Kafka's auto-commit;
//   - dedup: dedup.Consumer against the same batch-per-transaction consumer
//     without the claim;
//   - outbox: outbox.Relay relaying records already committed to the
//     outbox, against the same relay at-least-once (acknowledged, then the
//     slot told) and an idempotent producer writing the same records from
//     memory (the physical reference). Its latency runs commit one record
//     per database transaction, 2,000 per second, and measure from the
//     commit (the record's timestamp, which the relay sets to it) until a
//     read_committed reader sees it.
//
// Throughput is the median of -runs runs; each run copies pre-seeded
// records from a fresh topic, timed from the consumer's start until every
// record is visible (read_committed output, or committed rows). Latency
// comes from a separate run per variant with records produced at a steady
// 2,000 per second for 5 seconds: the time from produce until a
// read_committed reader, or a poller of the results table, sees the
// result. Peak heap is the benchmark process's, sampled every 100 ms during
// the throughput runs. After the table come the I/O-bound table (a 5 ms
// handler at concurrency bounds from 1 up, for eos, offsetstore and dedup,
// with a backlog and live; see concurrency.go) and the cost of dedup's
// claim as the processed-ids table grows.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/outbox"
)

func main() {
	sizesFlag := flag.String("sizes", "100,1024", "record value sizes in bytes")
	runs := flag.Int("runs", 3, "throughput runs per variant (the median is reported)")
	kafkaRecords := flag.Int("records", 300_000, "records per throughput run on the eos path")
	dbRecords := flag.Int("db-records", 100_000, "records per throughput run on the offsetstore and dedup paths")
	outboxRecords := flag.Int("outbox-records", 500_000, "records per throughput run on the outbox path")
	only := flag.String("only", "", "run only this path (eos, offsetstore, dedup, outbox, or io: the I/O-bound concurrency table)")
	idSizes := flag.String("id-table-sizes", "0,1000000,10000000", "processed-ids table sizes at which to time dedup's claim (empty: skip)")
	flag.Parse()

	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	dbURL := os.Getenv("DATABASE_URL")
	if brokers[0] == "" || dbURL == "" {
		fail(fmt.Errorf("set KAFKA_BROKERS and DATABASE_URL (make bench starts the services and sets them)"))
	}
	var sizes []int
	for _, s := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			fail(fmt.Errorf("-sizes: %w", err))
		}
		sizes = append(sizes, n)
	}

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		fail(err)
	}
	defer pool.Close()
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		fail(err)
	}
	defer admCl.Close()
	b := &bench{brokers: brokers, pool: pool, adm: kadm.NewClient(admCl), runs: *runs}
	if err := b.createTables(ctx); err != nil {
		fail(err)
	}
	defer b.dropTables(ctx)

	fmt.Fprintf(os.Stderr, "bench: GOMAXPROCS=%d, %d runs per variant\n", runtime.GOMAXPROCS(0), *runs)
	var rows []row
	if *only == "" || *only == "outbox" {
		if err := outbox.Migrate(ctx, pool); err != nil {
			fail(fmt.Errorf("outbox: %w", err))
		}
		// Migrate made the database's own slot, which nothing here reads.
		if slot, err := outbox.DefaultSlot(ctx, pool); err == nil {
			_ = outbox.DropSlot(ctx, pool, slot)
		}
	}
	for _, p := range []path{eosPath(*kafkaRecords), offsetstorePath(*dbRecords), dedupPath(*dbRecords), outboxPath(*outboxRecords)} {
		if *only != "" && p.name != *only || *only == "io" {
			continue
		}
		for _, size := range sizes {
			rs, err := b.measure(ctx, p, size)
			if err != nil {
				fail(fmt.Errorf("%s, %d B: %w", p.name, size, err))
			}
			rows = append(rows, rs...)
		}
	}
	printTable(os.Stdout, rows, *runs)
	if *only == "" || *only == "io" {
		if err := b.ioBound(ctx, os.Stdout, ""); err != nil {
			fail(fmt.Errorf("io: %w", err))
		}
	}

	if (*only == "" || *only == "dedup") && *idSizes != "" {
		var ns []int
		for _, s := range strings.Split(*idSizes, ",") {
			n, err := strconv.Atoi(s)
			if err != nil {
				fail(fmt.Errorf("-id-table-sizes: %w", err))
			}
			ns = append(ns, n)
		}
		if !slices.IsSorted(ns) {
			fail(fmt.Errorf("-id-table-sizes must grow: %v", ns))
		}
		if err := claimCost(ctx, os.Stdout, pool, ns, 20_000); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	os.Exit(1)
}
