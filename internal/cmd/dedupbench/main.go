// Command dedupbench measures what deduplication costs, side by side in one
// run on one broker and one PostgreSQL, and prints two markdown tables:
//
//  1. throughput of dedup.Consumer against the same batch-per-transaction
//     consumer without the claim, both making the same inserts;
//
//  2. the cost of claiming ids as the processed-ids table grows.
//
//     KAFKA_BROKERS=... DATABASE_URL=... go run ./internal/cmd/dedupbench [-records 50000] [-sizes 0,1000000,10000000]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/internal/benchkit"
)

func main() {
	records := flag.Int("records", 50_000, "records per throughput run")
	runs := flag.Int("runs", 3, "throughput runs per variant (median reported)")
	sizesFlag := flag.String("sizes", "0,1000000,10000000", "processed-ids table sizes to measure claims at")
	claims := flag.Int("claims", 20_000, "claims measured at each table size")
	flag.Parse()
	brokers, dbURL := benchkit.Services("dedupbench", true)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		benchkit.Fail("dedupbench", err)
	}
	defer pool.Close()

	throughput(ctx, brokers, pool, *records, *runs)
	var sizes []int
	for _, s := range strings.Split(*sizesFlag, ",") {
		n, err := strconv.Atoi(s)
		if err != nil {
			benchkit.Fail("dedupbench", err)
		}
		sizes = append(sizes, n)
	}
	claimCost(ctx, pool, sizes, *claims)
}

// throughput consumes the same topic with and without dedup. Both variants
// poll batches of 500, insert every record in one transaction per batch, and
// commit offsets after the database.
func throughput(ctx context.Context, brokers []string, pool *pgxpool.Pool, n, runs int) {
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		benchkit.Fail("dedupbench", err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	topic := fmt.Sprintf("dedupbench-%d", time.Now().UnixNano())
	if _, err := adm.CreateTopic(ctx, 4, 1, nil, topic); err != nil {
		benchkit.Fail("dedupbench", err)
	}
	defer func() { _, _ = adm.DeleteTopics(ctx, topic) }()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		benchkit.Fail("dedupbench", err)
	}
	for i := range n {
		prod.Produce(ctx, dedup.Stamp(&kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "payload-%090d", i)}), nil)
	}
	if err := prod.Flush(ctx); err != nil {
		benchkit.Fail("dedupbench", err)
	}
	prod.Close()

	store, err := dedup.NewPostgresStore("dedupbench_ids")
	if err != nil {
		benchkit.Fail("dedupbench", err)
	}
	benchkit.Exec(ctx, "dedupbench", pool, `DROP TABLE IF EXISTS dedupbench_ids, dedupbench_effects; CREATE TABLE dedupbench_effects (id text, value bytea)`)
	defer benchkit.Exec(ctx, "dedupbench", pool, `DROP TABLE IF EXISTS dedupbench_ids, dedupbench_effects`)
	if err := store.Migrate(ctx, pool); err != nil {
		benchkit.Fail("dedupbench", err)
	}
	insert := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		_, err := tx.Exec(ctx, `INSERT INTO dedupbench_effects VALUES ($1, $2)`, r.Key, r.Value)
		return err
	}

	rates := map[string][]float64{}
	for run := range runs {
		for _, variant := range []string{"plain", "dedup"} {
			benchkit.Exec(ctx, "dedupbench", pool, `TRUNCATE dedupbench_ids, dedupbench_effects`)
			group := fmt.Sprintf("%s-%s-%d", topic, variant, run)
			start := time.Now()
			if variant == "dedup" {
				c, err := dedup.NewConsumer(pool, store, insert, dedup.Brokers(brokers...), dedup.Group(group), dedup.Topics(topic),
					dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
				if err != nil {
					benchkit.Fail("dedupbench", err)
				}
				runUntil(c.Run, func() bool { return c.Stats().Applied >= int64(n) })
			} else {
				plainConsume(ctx, brokers, pool, topic, group, n, insert)
			}
			d := time.Since(start)
			rates[variant] = append(rates[variant], float64(n)/d.Seconds())
			fmt.Fprintf(os.Stderr, "  run %d  %-6s %8.0f records/s (%s)\n", run+1, variant, float64(n)/d.Seconds(), d.Round(time.Millisecond))
		}
	}
	base := benchkit.Median(rates["plain"])
	fmt.Printf("\n| consumer (%d records, batches of 500, one insert each) | records/s (median of %d) | vs without dedup |\n| --- | ---: | ---: |\n", n, runs)
	fmt.Printf("| without dedup | %.0f | 1.00x |\n", base)
	fmt.Printf("| dedup.Consumer | %.0f | %.2fx |\n", benchkit.Median(rates["dedup"]), benchkit.Median(rates["dedup"])/base)
}

func runUntil(run func(context.Context) error, done func() bool) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- run(ctx) }()
	for !done() {
		select {
		case err := <-errc:
			benchkit.Fail("dedupbench", fmt.Errorf("consumer stopped: %v", err))
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-errc; err != nil {
		benchkit.Fail("dedupbench", err)
	}
}

// plainConsume is dedup.Consumer's loop without the claim.
func plainConsume(ctx context.Context, brokers []string, pool *pgxpool.Pool, topic, group string, n int, h dedup.Handler) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		benchkit.Fail("dedupbench", err)
	}
	defer cl.Close()
	for done := 0; done < n; {
		recs := cl.PollRecords(ctx, 500).Records()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, r := range recs {
				if err := h(ctx, tx, r); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			benchkit.Fail("dedupbench", err)
		}
		if err := cl.CommitRecords(ctx, recs...); err != nil {
			benchkit.Fail("dedupbench", err)
		}
		done += len(recs)
	}
}

// claimCost grows the processed-ids table to each size and times claims of
// new ids in batches of 500 at that size.
func claimCost(ctx context.Context, pool *pgxpool.Pool, sizes []int, claims int) {
	store, err := dedup.NewPostgresStore("dedupbench_growth")
	if err != nil {
		benchkit.Fail("dedupbench", err)
	}
	benchkit.Exec(ctx, "dedupbench", pool, `DROP TABLE IF EXISTS dedupbench_growth`)
	defer benchkit.Exec(ctx, "dedupbench", pool, `DROP TABLE IF EXISTS dedupbench_growth`)
	if err := store.Migrate(ctx, pool); err != nil {
		benchkit.Fail("dedupbench", err)
	}
	fmt.Printf("\n| processed ids in table | µs per claim (batches of 500, %d claims) | vs empty table |\n| ---: | ---: | ---: |\n", claims)
	filled, probe := 0, 0
	var first float64
	for _, size := range sizes {
		if size > filled {
			start := time.Now()
			// UUID-like random ids, as Stamp makes, so the index is the
			// shape production gives it.
			benchkit.Exec(ctx, "dedupbench", pool, fmt.Sprintf(`INSERT INTO dedupbench_growth (scope, id)
				SELECT 's', md5(g::text) FROM generate_series(%d, %d) g`, filled+1, size))
			benchkit.Exec(ctx, "dedupbench", pool, `ANALYZE dedupbench_growth`)
			fmt.Fprintf(os.Stderr, "  filled the table to %d ids in %s\n", size, time.Since(start).Round(time.Second))
			filled = size
		}
		start := time.Now()
		for done := 0; done < claims; done += 500 {
			ids := make([]string, 500)
			for i := range ids {
				probe++
				ids[i] = fmt.Sprintf("probe-%d", probe)
			}
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := store.ClaimBatch(ctx, tx, "s", ids)
				return err
			})
			if err != nil {
				benchkit.Fail("dedupbench", err)
			}
		}
		perClaim := float64(time.Since(start).Microseconds()) / float64(claims)
		if first == 0 {
			first = perClaim
		}
		fmt.Printf("| %d | %.1f | %.2fx |\n", size, perClaim, perClaim/first)
	}
}
