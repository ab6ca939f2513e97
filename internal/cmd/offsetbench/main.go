// Command offsetbench measures offsetstore.Runner at several batch sizes
// against an at-least-once consumer making the same inserts with Kafka
// auto-commit, side by side in one run, and prints a markdown table.
//
//	KAFKA_BROKERS=... DATABASE_URL=... go run ./internal/cmd/offsetbench [-records 500000] [-runs 3]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/benchkit"
	"github.com/eoskit/eoskit/offsetstore"
)

func main() {
	records := flag.Int("records", 500_000, "records per run")
	runs := flag.Int("runs", 3, "runs per variant (median reported)")
	flag.Parse()
	brokers, dbURL := benchkit.Services("offsetbench", true)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		benchkit.Fail("offsetbench", err)
	}
	defer pool.Close()
	if err := offsetstore.Migrate(ctx, pool); err != nil {
		benchkit.Fail("offsetbench", err)
	}
	benchkit.Exec(ctx, "offsetbench", pool, `DROP TABLE IF EXISTS offsetbench_rows; CREATE TABLE offsetbench_rows (id bytea, value bytea, part integer, off bigint)`)
	defer benchkit.Exec(ctx, "offsetbench", pool, `DROP TABLE IF EXISTS offsetbench_rows`)

	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		benchkit.Fail("offsetbench", err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	topic := fmt.Sprintf("offsetbench-%d", time.Now().UnixNano())
	if _, err := adm.CreateTopic(ctx, 4, 1, nil, topic); err != nil {
		benchkit.Fail("offsetbench", err)
	}
	defer func() { _, _ = adm.DeleteTopics(ctx, topic) }()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		benchkit.Fail("offsetbench", err)
	}
	for i := range *records {
		prod.Produce(ctx, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "payload-%090d", i)}, nil)
	}
	if err := prod.Flush(ctx); err != nil {
		benchkit.Fail("offsetbench", err)
	}
	prod.Close()

	variants := []string{"at-least-once, auto-commit, batch 1000", "offsetstore, batch 100", "offsetstore, batch 1000", "offsetstore, batch 10000"}
	batch := map[string]int{variants[0]: 1000, variants[1]: 100, variants[2]: 1000, variants[3]: 10000}
	rates := map[string][]float64{}
	for run := range *runs {
		for i, v := range variants {
			benchkit.Exec(ctx, "offsetbench", pool, `TRUNCATE offsetbench_rows`)
			group := fmt.Sprintf("%s-%d-%d", topic, run, i)
			start := time.Now()
			if i == 0 {
				autoCommitConsume(ctx, brokers, pool, topic, group, *records, batch[v])
			} else {
				runner(ctx, brokers, pool, topic, group, *records, batch[v])
			}
			d := time.Since(start)
			rates[v] = append(rates[v], float64(*records)/d.Seconds())
			fmt.Fprintf(os.Stderr, "  run %d  %-40s %8.0f rows/s (%s)\n", run+1, v, float64(*records)/d.Seconds(), d.Round(time.Millisecond))
		}
	}
	base := benchkit.Median(rates[variants[0]])
	fmt.Printf("\n| consumer (%d records, COPY per batch) | rows/s (median of %d) | vs at-least-once |\n| --- | ---: | ---: |\n", *records, *runs)
	for _, v := range variants {
		fmt.Printf("| %s | %.0f | %.2fx |\n", v, benchkit.Median(rates[v]), benchkit.Median(rates[v])/base)
	}
}

func copyRows(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
	rows := make([][]any, len(recs))
	for i, r := range recs {
		rows[i] = []any{r.Key, r.Value, r.Partition, r.Offset}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"offsetbench_rows"}, []string{"id", "value", "part", "off"}, pgx.CopyFromRows(rows))
	return err
}

func rowCount(ctx context.Context, pool *pgxpool.Pool) int {
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM offsetbench_rows`).Scan(&n); err != nil {
		benchkit.Fail("offsetbench", err)
	}
	return n
}

func runner(ctx context.Context, brokers []string, pool *pgxpool.Pool, topic, group string, n, batch int) {
	r, err := offsetstore.New(pool, copyRows, offsetstore.Brokers(brokers...), offsetstore.Group(group),
		offsetstore.Topics(topic), offsetstore.MaxPollRecords(batch))
	if err != nil {
		benchkit.Fail("offsetbench", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(runCtx) }()
	for r.Stats().Records < int64(n) {
		select {
		case err := <-errc:
			benchkit.Fail("offsetbench", fmt.Errorf("runner stopped: %v", err))
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	if err := <-errc; err != nil {
		benchkit.Fail("offsetbench", err)
	}
}

// autoCommitConsume is the at-least-once baseline: the same COPY per polled
// batch, with Kafka's auto-commit (every 5 s by default) and no offsets in
// the database.
func autoCommitConsume(ctx context.Context, brokers []string, pool *pgxpool.Pool, topic, group string, n, batch int) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		benchkit.Fail("offsetbench", err)
	}
	defer cl.Close()
	for done := 0; done < n; {
		recs := cl.PollRecords(ctx, batch).Records()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return copyRows(ctx, tx, recs) }); err != nil {
			benchkit.Fail("offsetbench", err)
		}
		done += len(recs)
	}
	if got := rowCount(ctx, pool); got < n {
		benchkit.Fail("offsetbench", fmt.Errorf("baseline wrote %d rows, want %d", got, n))
	}
}
