package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/offsetstore"
)

// The database paths write one row per record to rowsTable; produced_ns
// carries the record's produce time for the latency observer.
const (
	rowsTable   = "eoskit_bench_rows"
	idsTable    = "eoskit_bench_ids"
	growthTable = "eoskit_bench_growth"
)

func (b *bench) createTables(ctx context.Context) error {
	if err := offsetstore.Migrate(ctx, b.pool); err != nil {
		return err
	}
	b.dropTables(ctx)
	if _, err := b.pool.Exec(ctx, `CREATE TABLE `+rowsTable+` (seq bigserial PRIMARY KEY, id bytea, value bytea, part integer, off bigint, produced_ns bigint)`); err != nil {
		return err
	}
	store, err := dedup.NewPostgresStore(idsTable)
	if err != nil {
		return err
	}
	return store.Migrate(ctx, b.pool)
}

func (b *bench) dropTables(ctx context.Context) {
	_, _ = b.pool.Exec(ctx, `DROP TABLE IF EXISTS `+rowsTable+`, `+idsTable+`, `+growthTable)
}

var rowColumns = []string{"id", "value", "part", "off", "produced_ns"}

func rowOf(r *kgo.Record) []any {
	return []any{r.Key, r.Value, r.Partition, r.Offset, r.Timestamp.UnixNano()}
}

// copyRows writes a batch with one COPY, as a bulk loader would.
func copyRows(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
	rows := make([][]any, len(recs))
	for i, r := range recs {
		rows[i] = rowOf(r)
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{rowsTable}, rowColumns, pgx.CopyFromRows(rows))
	return err
}

// insertRow is a side effect per record, as a dedup user's handler has.
func insertRow(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+rowsTable+` (id, value, part, off, produced_ns) VALUES ($1, $2, $3, $4, $5)`, rowOf(r)...)
	return err
}

// errMalformed is the handlers' error for a malformed record.
var errMalformed = errors.New("malformed record")

// malformed reports whether r is one of the 1% of records (the keys
// k50, k150, ...) that the "1% malformed" variants' handlers refuse.
func malformed(r *kgo.Record) bool {
	n, err := strconv.Atoi(strings.TrimPrefix(string(r.Key), "k"))
	return err == nil && n%100 == 50
}

// copyNamingMalformed is copyRows behind a check of the batch that names
// the first malformed record with offsetstore.Reject.
func copyNamingMalformed(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
	for _, r := range recs {
		if malformed(r) {
			return offsetstore.Reject(r, errMalformed)
		}
	}
	return copyRows(ctx, tx, recs)
}

// copyRefusingMalformed is copyRows behind the same check, failing the
// batch without naming the record.
func copyRefusingMalformed(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
	if slices.ContainsFunc(recs, malformed) {
		return errMalformed
	}
	return copyRows(ctx, tx, recs)
}

// insertValidRow is insertRow refusing a malformed record.
func insertValidRow(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
	if malformed(r) {
		return errMalformed
	}
	return insertRow(ctx, tx, r)
}

func offsetstorePath(records int) path {
	runner := func(batch int, h offsetstore.Handler, opts ...offsetstore.Option) func(context.Context, *env) (running, error) {
		return func(ctx context.Context, e *env) (running, error) {
			r, err := offsetstore.NewRunner(e.pool, h, append([]offsetstore.Option{offsetstore.Brokers(e.brokers...), offsetstore.Group(e.group),
				offsetstore.Topics(e.in), offsetstore.MaxRecordsPerCommit(batch), offsetstore.Logger(quiet)}, opts...)...)
			if err != nil {
				return running{}, err
			}
			return running{progress: func() int64 { return r.Stats().Records }, wait: background(func() error { return r.Run(ctx) })}, nil
		}
	}
	return path{
		name: "offsetstore", records: records, partitions: 4,
		variants: []variant{
			{name: "at-least-once, auto-commit, batch 1000", start: autoCommitCopy(1000)},
			{name: "offsetstore, batch 100", start: runner(100, copyRows)},
			{name: "offsetstore, batch 1000", start: runner(1000, copyRows)},
			{name: "offsetstore, batch 10000", start: runner(10000, copyRows)},
			// 1% malformed records, parked (progress counts them): a
			// handler that names the record with Reject, and one that
			// names nothing (bisection inside the transaction). No
			// latency run: a parked record never shows in the results.
			{name: "offsetstore, batch 1000, 1% malformed, OnHandlerError(DeadLetter()), handler names it (Reject)", clean: "offsetstore, batch 1000",
				start: runner(1000, copyNamingMalformed, offsetstore.OnHandlerError(offsetstore.DeadLetter())), throughputOnly: true},
			{name: "offsetstore, batch 1000, 1% malformed, OnHandlerError(DeadLetter()), handler names nothing", clean: "offsetstore, batch 1000",
				start: runner(1000, copyRefusingMalformed, offsetstore.OnHandlerError(offsetstore.DeadLetter())), throughputOnly: true},
		},
	}
}

// autoCommitCopy is offsetstore's at-least-once baseline: the same COPY per
// polled batch, with Kafka's auto-commit (every 5 s by default) and no
// offsets in the database.
func autoCommitCopy(batch int) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumerGroup(e.group), kgo.ConsumeTopics(e.in),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			return running{}, err
		}
		var done atomic.Int64
		loop := func() error {
			defer cl.Close()
			for {
				recs := cl.PollRecords(ctx, batch).Records()
				if ctx.Err() != nil {
					return nil
				}
				if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return copyRows(ctx, tx, recs) }); err != nil {
					return err
				}
				done.Add(int64(len(recs)))
			}
		}
		return running{progress: done.Load, wait: background(loop)}, nil
	}
}

func dedupPath(records int) path {
	store, err := dedup.NewPostgresStore(idsTable)
	if err != nil {
		fail(err)
	}
	consumer := func(h dedup.Handler, opts ...dedup.Option) func(context.Context, *env) (running, error) {
		return func(ctx context.Context, e *env) (running, error) {
			c, err := dedup.NewConsumer(e.pool, store, h, append([]dedup.Option{dedup.Brokers(e.brokers...), dedup.Group(e.group), dedup.Topics(e.in),
				dedup.Logger(quiet), dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))}, opts...)...)
			if err != nil {
				return running{}, err
			}
			progress := func() int64 { s := c.Stats(); return s.Applied + s.DeadLetters }
			return running{progress: progress, wait: background(func() error { return c.Run(ctx) })}, nil
		}
	}
	return path{
		name: "dedup", records: records, partitions: 4, stamp: true,
		variants: []variant{
			{name: "at-least-once, same consumer without dedup", start: plainConsume},
			{name: "dedup.Consumer", start: consumer(insertRow)},
			{name: "dedup.Consumer, 1% malformed, OnHandlerError(DeadLetter())", clean: "dedup.Consumer",
				start: consumer(insertValidRow, dedup.OnHandlerError(dedup.DeadLetter())), throughputOnly: true},
		},
	}
}

// plainConsume is dedup.Consumer's loop without the claim: batches of 500
// (dedup's default poll), one insert per record in one transaction per
// batch, offsets committed after the database.
func plainConsume(ctx context.Context, e *env) (running, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumerGroup(e.group), kgo.ConsumeTopics(e.in),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return running{}, err
	}
	var done atomic.Int64
	loop := func() error {
		defer cl.Close()
		for {
			recs := cl.PollRecords(ctx, 500).Records()
			if ctx.Err() != nil {
				return nil
			}
			err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				for _, r := range recs {
					if err := insertRow(ctx, tx, r); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			if err := cl.CommitRecords(ctx, recs...); err != nil {
				return err
			}
			done.Add(int64(len(recs)))
		}
	}
	return running{progress: done.Load, wait: background(loop)}, nil
}

// claimCost grows a processed-ids table to each size and times claims of
// new ids in batches of 500 at that size.
func claimCost(ctx context.Context, w io.Writer, pool *pgxpool.Pool, sizes []int, claims int) error {
	store, err := dedup.NewPostgresStore(growthTable)
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx, pool); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n| dedup: processed ids in table | µs per claim (batches of 500, %d claims) | vs empty table |\n| ---: | ---: | ---: |\n", claims)
	filled, probe := 0, 0
	var first float64
	for _, size := range sizes {
		if size > filled {
			start := time.Now()
			// UUID-like random ids, as Stamp makes, so that the index
			// has the shape production gives it.
			if _, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (scope, id) SELECT 's', convert_to(md5(g::text), 'UTF8') FROM generate_series(%d, %d) g`, growthTable, filled+1, size)); err != nil {
				return err
			}
			if _, err := pool.Exec(ctx, `ANALYZE `+growthTable); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "  filled the ids table to %d in %s\n", size, time.Since(start).Round(time.Second))
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
				return err
			}
		}
		perClaim := float64(time.Since(start).Microseconds()) / float64(claims)
		if first == 0 {
			first = perClaim
		}
		fmt.Fprintf(w, "| %d | %.1f | %.2fx |\n", size, perClaim, perClaim/first)
	}
	return nil
}
