// Command bench measures what each of eoskit's guarantees costs, side by
// side in one run on one broker and one PostgreSQL, and prints markdown
// tables: records per second, latency and peak heap for every variant, as
// ratios to its path's baselines and to the goals of issue 13.
//
//	KAFKA_BROKERS=... DATABASE_URL=... go run ./tools/bench [-only eos] [-window 10s] [-runs 3] ...
//
// -only runs one part: eos, single, memory, state, backlog, restore,
// restart, rolling, offsetstore, dedup, outbox or io. By default all run, in that order (offsetstore, dedup and
// outbox share one table), and then the cost of dedup's claim (which -only
// dedup includes).
//
// The eos parts run over windows of work (see window.go): every copier
// reads a backlog larger than it can copy in the run, from the start of
// one input topic per record size, with a fresh group and output topic per
// run; its rate is the input records whose copies committed during a
// -window (default 10s) after a -warmup (default 2s) that starts at its
// first commit, counted by the growth of its group's committed offsets
// (which a transaction commits with its output). Each variant runs -runs
// times (default 3), interleaved round robin across variants (A B C A B C
// ...) so that drift in the machine's load hits all alike; the tables give
// the median, min-max and spread ((max-min)/median), and the benchmark
// process's CPU time per record copied (steadier than the rate on a shared
// machine; the broker's CPU is not in it). A run that copies the whole
// backlog within its window, or commits nothing during it, is repeated.
//
//   - eos (the CPU-bound table): a copy handler over 6 partitions, records
//     of each of -sizes (default 100 and 1024 B): the at-least-once loop
//     (eos.Processor under AtLeastOnce) and a raw franz-go
//     GroupTransactSession at 100 ms, eos.Processor at each of -intervals
//     (default 10ms, 100ms and 1s; 100ms always), every one committing by
//     interval (MaxRecordsPerCommit 1,000,000), and an idempotent producer
//     alone writing records of the size. Ratios to the at-least-once loop
//     and to the raw session, and the goals for eos.Processor at 100 ms:
//     ≥ 0.97x the former, ≥ 0.97x the latter (within 3%). Then, unless
//     -latency=false, p50 and p99 latency from a separate run per variant
//     with records produced at 2,000 per second for 5 s: the time from
//     produce until a read_committed reader sees the copy.
//   - single: one partition, 100 B records: eos.Processor with its defaults
//     (Brokers, Group, Topics, TransactionalID only), against an
//     idempotent producer alone with franz-go's defaults writing to a
//     one-partition topic (goal: ≥ 0.5x), the at-least-once loop with its
//     defaults and with 10,000 records per commit, and eos.Processor with
//     candidate settings (MaxRecordsPerCommit, FetchMaxPartitionBytes,
//     ProducerLinger) that show what bounds it: records per commit, commits
//     per second, how long each was open, and a second table of the
//     requests the clients made (per second, mean time to response, and
//     how many took 5 ms or more: with transaction protocol v2 the broker
//     holds a transaction's first Produce while the previous transaction's
//     markers are written). These processors also carry a probe
//     (WithMetrics, a kgo hook): it observes, changing no setting.
//   - memory: the peak heap in use (runtime/metrics, sampled every 10 ms) of
//     eos.Processor, ExactlyOnce at 100 ms, copying each of -mem-records
//     (default 1,000,000 and 10,000,000) records of 100 B from one
//     backlog; goal: the largest within 1.10x the smallest. Then the same
//     for a windowed count (windowmemory.go: tumbling 1m, 10,000 keys,
//     record times a millisecond apart) with its windows' retention, and
//     once with windows kept 1,000 hours: the heap a window of a key costs.
//   - state (issue 27, keyed state; see state.go): count by key, 100 B
//     random records over 6 partitions with keys drawn from 1,000
//     (k0 ... k999), from a backlog: Kafka Streams 4.4.0
//     groupByKey().count() under exactly_once_v2 at its default 100 ms
//     commit interval (a Java peer built from Maven Central's jars by
//     scripts/streams.sh, run as a process of its own; its group is its
//     application.id; -streams-threads, default 1, as eos.Processor has one
//     poll loop), and eos.Processor's stateless copy at 100 ms of the same
//     input, each as a ratio to both, beside eoskit's count by key
//     (eos.Count; issue 27's goals for it: ≥ 1.0x Kafka Streams, ≥ 0.8x
//     the copy), and the windowed count of both (tumbling one minute of
//     record time, grace 10 s: Kafka Streams' windowedBy(...).count()
//     and eos.WindowedCount; issue 45's goal: ≥ 2.0x). Its warm-up is
//     -state-warmup (default 10s: the JVM takes about 6 s after its first
//     commit to reach its pace), its CPU column the worker's (the JVM's
//     for Kafka Streams, from /proc). Unless -check=false, it then checks
//     the peer once: Kafka Streams counts 20,000 records, and a
//     read_committed reader of its output must see every key's count grow
//     to the input's count of that key.
//   - backlog (see backlog.go): the count by key timed as a user meets
//     it, from the process's start to its group's commit of the last of
//     -backlog-records (default 6,000,000) 100 B records over 6
//     partitions and 1,000 keys, start-up included: eos.Count against
//     Kafka Streams with one and with two stream threads (issue 45's
//     goal: ≥ 2x the better of these).
//   - restore (see restore.go and assigned.go): a compacted changelog of
//     -restore-keys (default 1,000,000) keys over 6 partitions restored
//     into each kind of store, against a plain read_committed consumer
//     reading it; then a newly assigned partition set: one processor with
//     nothing on its disk restoring every partition of a changelog, Kafka
//     Streams 4.4 (RocksDB and its in-memory store) and eos.Processor
//     (memory and pebble stores) restoring the same topic (issue 46's
//     goal: ≥ 2x Kafka Streams' rate).
//   - restart (see restart.go): a counter (a child process) SIGKILLed and
//     started again, with eos.InstanceID on a pebble store (issue 46's
//     goal: every partition's first commit within 3 s of the restart), on
//     memory stores, and with no InstanceID.
//   - rolling (see rolling.go): one of three counting instances leaves (a
//     rolling restart's SIGTERM); the time until its partitions commit
//     under their new owners, eos.Processor with and without Standbys
//     against Kafka Streams with and without num.standby.replicas (issue
//     46's goals: within 5 s with one standby, ≥ 5x faster than without,
//     no slower than Kafka Streams).
//
// -cpuprofile DIR writes a CPU profile of the benchmark process over each
// window of the eos and single parts to DIR (go tool pprof).
//
// The database paths and the outbox are measured over a fixed record count
// each, in one table whose figures are ratios to the path's at-least-once
// baseline:
//
//   - offsetstore: the Runner at batches of 100, 1,000 and 10,000 against a
//     consumer making the same COPY per batch with Kafka's auto-commit;
//     and at 1,000 with 1% malformed records (keys k50, k150, ...) under
//     OnHandlerError(DeadLetter()), with a handler that names the record
//     (offsetstore.Reject) and one that names nothing (bisection inside
//     the transaction), each also as a ratio to the clean run at 1,000
//     (issue 26's goal: at least 0.5x);
//   - dedup: dedup.Consumer against the same batch-per-transaction consumer
//     without the claim, and with 1% malformed records under
//     OnHandlerError(DeadLetter()), also as a ratio to the clean run;
//   - outbox: outbox.Relay relaying records already committed to the
//     outbox, against the same relay at-least-once (acknowledged, then the
//     slot told) and an idempotent producer writing the same records from
//     memory (the physical reference). Its latency runs commit one record
//     per database transaction, 2,000 per second, and measure from the
//     commit (the record's timestamp, which the relay sets to it) until a
//     read_committed reader sees it.
//
// Their throughput is the median of -runs runs; each run copies pre-seeded
// records from a fresh topic, timed from the consumer's start until every
// record is visible (read_committed output, or committed rows). Latency
// comes from a separate run per variant with records produced at a steady
// 2,000 per second for 5 seconds: the time from produce until a
// read_committed reader, or a poller of the results table, sees the
// result. Peak heap is the benchmark process's, sampled every 100 ms during
// the throughput runs. Then come the I/O-bound table (a 5 ms handler at
// concurrency bounds from 1 up, for eos, offsetstore and dedup, with a
// backlog and live, then p50 and p99 latency at half the throughput goal
// against p99 <= 125 ms; see concurrency.go) and the cost of dedup's claim as
// the processed-ids table grows.
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
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/outbox"
)

func main() {
	if what := os.Getenv(childEnv); what != "" {
		os.Exit(runChild(what)) // the restart part's counter (restart.go)
	}
	sizesFlag := flag.String("sizes", "100,1024", "record value sizes in bytes (eos table and the database paths)")
	runs := flag.Int("runs", 3, "runs per variant (the median is reported)")
	window := flag.Duration("window", 10*time.Second, "eos and single parts: the window of work each run measures")
	warmup := flag.Duration("warmup", 2*time.Second, "eos and single parts: the warm-up after a run's first commit")
	intervalsFlag := flag.String("intervals", "10ms,100ms,1s", "eos part: eos.Processor's commit intervals (100ms, the goals' interval, is always measured)")
	withLatency := flag.Bool("latency", true, "eos part: measure latency too")
	memRecords := flag.String("mem-records", "1000000,10000000", "memory part: record counts to copy (the last is compared to the first)")
	cpuProfiles := flag.String("cpuprofile", "", "directory to write a CPU profile of each eos and single window to")
	dbRecords := flag.Int("db-records", 100_000, "records per throughput run on the offsetstore and dedup paths")
	outboxRecords := flag.Int("outbox-records", 500_000, "records per throughput run on the outbox path")
	only := flag.String("only", "", "run only this part: eos, single, memory, state, backlog, restore, restart, rolling, offsetstore, dedup, outbox, or io (the I/O-bound concurrency table)")
	restoreKeys := flag.Int("restore-keys", 1_000_000, "restore and restart parts: the keys (records) of the changelog each variant reads, and of the restarted counter's input")
	streamsThreads := flag.Int("streams-threads", 1, "state part: the Kafka Streams peer's num.stream.threads (1: one poll loop, as eos.Processor's)")
	stateWarmup := flag.Duration("state-warmup", 10*time.Second, "state part: the warm-up after a run's first commit (Kafka Streams' JVM takes about 6 s to reach its pace)")
	backlogRecords := flag.Int("backlog-records", 6_000_000, "backlog part: the backlog the count by key's wall clock is timed over, start-up included")
	check := flag.Bool("check", true, "state part: after its runs, check once that the Kafka Streams peer's counts equal the input's")
	ioPath := flag.String("io-path", "", "io part: run only this path's variants (eos, offsetstore or dedup)")
	ioName := flag.String("io-variant", "", "io part: run only the variants whose name matches this regular expression (\"PartitionOrder\", \"^Concurrency 1$\")")
	idSizes := flag.String("id-table-sizes", "0,1000000,10000000", "processed-ids table sizes at which to time dedup's claim (empty: skip)")
	flag.Parse()
	pickIO, err := ioPicker(*ioPath, *ioName) // before any part runs: a bad pattern fails at once
	if err != nil {
		fail(err)
	}

	parts := []string{"eos", "single", "memory", "state", "backlog", "restore", "restart", "rolling", "offsetstore", "dedup", "outbox", "io"}
	if *only != "" && !slices.Contains(parts, *only) {
		fail(fmt.Errorf("-only %q: want one of %s", *only, strings.Join(parts, ", ")))
	}
	want := func(part string) bool { return *only == "" || *only == part }
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	dbURL := os.Getenv("DATABASE_URL")
	if brokers[0] == "" || dbURL == "" {
		fail(fmt.Errorf("set KAFKA_BROKERS and DATABASE_URL (make bench starts the services and sets them)"))
	}
	sizes, err := ints(*sizesFlag)
	if err != nil {
		fail(fmt.Errorf("-sizes: %w", err))
	}
	counts, err := ints(*memRecords)
	if err != nil || len(counts) == 0 {
		fail(fmt.Errorf("-mem-records: %v", err))
	}
	intervals := []time.Duration{100 * time.Millisecond}
	for _, s := range strings.Split(*intervalsFlag, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			fail(fmt.Errorf("-intervals: %q", s))
		}
		if !slices.Contains(intervals, d) {
			intervals = append(intervals, d)
		}
	}
	slices.Sort(intervals)
	if *runs < 1 || *window <= 0 || *warmup < 0 || *stateWarmup < 0 || *streamsThreads < 1 || *backlogRecords < 1 {
		fail(fmt.Errorf("-runs, -streams-threads and -backlog-records must be at least 1 and -window positive"))
	}
	if *cpuProfiles != "" {
		if err := os.MkdirAll(*cpuProfiles, 0o755); err != nil {
			fail(err)
		}
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
	b := &bench{brokers: brokers, pool: pool, adm: kadm.NewClient(admCl), runs: *runs,
		window: *window, warmup: *warmup, cpuProfiles: *cpuProfiles}
	if err := b.createTables(ctx); err != nil {
		fail(err)
	}
	defer onFail(func() { b.dropTables(ctx) })()

	fmt.Fprintf(os.Stderr, "bench: GOMAXPROCS=%d, %d runs per variant\n", runtime.GOMAXPROCS(0), *runs)
	if want("eos") {
		t := eosTable(sizes, intervals)
		rows, err := b.windowed(ctx, t)
		if err == nil && *withLatency {
			err = b.latencies(ctx, t, rows)
		}
		if err != nil {
			fail(fmt.Errorf("eos: %w", err))
		}
		printEOS(os.Stdout, rows, b)
	}
	if want("single") {
		rows, err := b.windowed(ctx, singleTable())
		if err != nil {
			fail(fmt.Errorf("single: %w", err))
		}
		printSingle(os.Stdout, rows, b)
	}
	if want("memory") {
		if err := b.memory(ctx, os.Stdout, counts); err != nil {
			fail(fmt.Errorf("memory: %w", err))
		}
		if err := b.windowMemory(ctx, os.Stdout, counts); err != nil {
			fail(fmt.Errorf("windowed memory: %w", err))
		}
	}
	if want("state") {
		sb := *b // the same bench, with the state part's warm-up
		sb.warmup = *stateWarmup
		if err := sb.state(ctx, os.Stdout, *streamsThreads, *check); err != nil {
			fail(fmt.Errorf("state: %w", err))
		}
	}

	if want("backlog") {
		if err := b.backlogWallClock(ctx, os.Stdout, *backlogRecords); err != nil {
			fail(fmt.Errorf("backlog: %w", err))
		}
	}

	if want("restore") {
		if err := b.restore(ctx, os.Stdout, *restoreKeys); err != nil {
			fail(fmt.Errorf("restore: %w", err))
		}
		if err := b.assignedRestore(ctx, os.Stdout, *restoreKeys); err != nil {
			fail(fmt.Errorf("restore of an assigned partition set: %w", err))
		}
	}
	if want("restart") {
		if err := b.restart(ctx, os.Stdout, *restoreKeys); err != nil {
			fail(fmt.Errorf("restart: %w", err))
		}
	}
	if want("rolling") {
		if err := b.rolling(ctx, os.Stdout, *restoreKeys); err != nil {
			fail(fmt.Errorf("rolling: %w", err))
		}
	}

	if want("outbox") {
		if err := outbox.Migrate(ctx, pool); err != nil {
			fail(fmt.Errorf("outbox: %w", err))
		}
		// Migrate made the database's own slot, which nothing here reads.
		if slot, err := outbox.DefaultSlot(ctx, pool); err == nil {
			_ = outbox.DropSlot(ctx, pool, slot)
		}
	}
	var rows []row
	for _, p := range []path{offsetstorePath(*dbRecords), dedupPath(*dbRecords), outboxPath(*outboxRecords)} {
		if !want(p.name) {
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
	if len(rows) > 0 {
		printTable(os.Stdout, rows, *runs)
	}
	if want("io") {
		if err := b.ioBound(ctx, os.Stdout, pickIO); err != nil {
			fail(fmt.Errorf("io: %w", err))
		}
	}

	if want("dedup") && *idSizes != "" {
		ns, err := ints(*idSizes)
		if err != nil {
			fail(fmt.Errorf("-id-table-sizes: %w", err))
		}
		if !slices.IsSorted(ns) {
			fail(fmt.Errorf("-id-table-sizes must grow: %v", ns))
		}
		if err := claimCost(ctx, os.Stdout, pool, ns, 20_000); err != nil {
			fail(err)
		}
	}
}

// ints parses a comma-separated list of integers.
func ints(s string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		ns = append(ns, n)
	}
	return ns, nil
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	cleanups.Lock()
	fs := cleanups.fs
	cleanups.fs = nil
	cleanups.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		if fs[i] != nil {
			fs[i]()
		}
	}
	os.Exit(1)
}

// cleanups are what fail undoes before it exits (the deferred cleanups
// would not run): the tables, and the backlogs, which hold gigabytes.
var cleanups struct {
	sync.Mutex
	fs []func()
}

// onFail registers f to run if the bench fails, until the returned func
// (which runs f) is called.
func onFail(f func()) (done func()) {
	cleanups.Lock()
	defer cleanups.Unlock()
	i := len(cleanups.fs)
	cleanups.fs = append(cleanups.fs, f)
	return func() {
		cleanups.Lock()
		registered := cleanups.fs != nil && cleanups.fs[i] != nil
		if registered {
			cleanups.fs[i] = nil
		}
		cleanups.Unlock()
		if registered {
			f()
		}
	}
}
