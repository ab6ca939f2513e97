package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/testsupport/srctree"
	"github.com/eoskit/eoskit/window"
)

// The state part (issue 27, keyed state): count by key over 100 B records,
// 6 partitions, 1,000 keys, from a backlog, in the windowed framework.
// Issue 27's goals are for eoskit's own count by key: ≥ 1.0x Kafka Streams
// exactly_once_v2 doing groupByKey().count() on the same broker, and ≥ 0.8x
// eos.Processor's stateless copy of the same input.

// roles of the state table's variants.
const (
	roleStreams = "streams" // Kafka Streams' count: ratio base
	// roleStreamsWindow is Kafka Streams' windowed count (ratio base),
	// roleWindowGoal eoskit's, which issue 45's goal is about.
	roleStreamsWindow = "streams-window"
	roleWindowGoal    = "window-goal"
	roleCopy          = "copy" // eos.Processor's stateless copy: ratio base
	// roleStreamsJoin is Kafka Streams' stream–table join (ratio base),
	// roleJoinGoal eoskit's, which issue 45's goal is about.
	roleStreamsJoin = "streams-join"
	roleJoinGoal    = "join-goal"
)

// stateKeys is how many distinct keys the state part's records carry.
const stateKeys = 1000

// stateTable is the keyed-state table: Kafka Streams' count by key (the
// Java peer, scripts/streams.sh) and eos.Processor's stateless copy at
// 100 ms, on one backlog of 100 B records over 1,000 keys; and both
// joining that backlog with table, a topic of a 100 B value for each of
// the 1,000 keys (see seedJoinTable).
func stateTable(script string, threads int, table string) wtable {
	return wtable{
		name: "state", partitions: 6, sizes: []int{100}, keys: stateKeys,
		guess: func(int) float64 { return 300_000 },
		variants: func(int) []wvariant {
			return []wvariant{
				{name: fmt.Sprintf("Kafka Streams 4.4.0 groupByKey().count(), exactly_once_v2, %d thread(s)", threads),
					start: streamsCount(script, threads, window.Spec{}), role: roleStreams},
				{name: "eos.Processor stateless copy, 100ms", start: processor(eos.ExactlyOnce, 100*time.Millisecond), role: roleCopy},
				{name: "eos.Processor count by key (eos.Count, memory store), 100ms", start: counting(eos.Count(), 100*time.Millisecond), role: roleGoal},
				{name: fmt.Sprintf("Kafka Streams 4.4.0 windowedBy(TimeWindows.ofSizeAndGrace(1m, 10s)).count(), exactly_once_v2, %d thread(s)", threads),
					start: streamsCount(script, threads, benchWindow), role: roleStreamsWindow},
				{name: "eos.Processor windowed count (eos.WindowedCount, tumbling 1m, grace 10s, memory store), 100ms", start: counting(windowedCount(), 100*time.Millisecond), role: roleWindowGoal},
				{name: fmt.Sprintf("Kafka Streams 4.4.0 stream.join(table), exactly_once_v2, %d thread(s)", threads),
					start: streamsJoin(script, threads, table), role: roleStreamsJoin},
				{name: "eos.Processor stream–table join (eos.JoinTable, memory store), 100ms", start: joining(table, 100*time.Millisecond), role: roleJoinGoal},
			}
		},
	}
}

// The goals of issue 27 for eoskit's count by key.
const (
	goalVsStreams = 1.0
	goalVsCopy    = 0.8
	// issue 45's goals for the windowed count and the stream–table join.
	goalWindowVsStreams = 2.0
	goalJoinVsStreams   = 2.0
)

// printState writes the keyed-state table: every row as a ratio to Kafka
// Streams' count and to eos's stateless copy, and the goals on the row of
// eoskit's count by key (role roleGoal) when there is one.
func printState(w io.Writer, rows []wrow, b *bench) {
	fmt.Fprintf(w, "\nstate, count by key: %d B records, 6 partitions, %d keys: input records committed per second (the group's committed offsets) during a %s window after a %s warm-up, from a backlog; median of %d interleaved runs (min-max; spread = (max-min)/median). CPU is the worker process's: the JVM's for Kafka Streams, the benchmark process's for eos. Goals for eoskit's count by key: ≥ %.2fx Kafka Streams, ≥ %.2fx eos's stateless copy\n\n",
		rows[0].size, stateKeys, b.window, b.warmup, b.runs, goalVsStreams, goalVsCopy)
	fmt.Fprintln(w, "| variant | records/s | min-max | spread | vs Kafka Streams count | vs Kafka Streams windowed count | vs Kafka Streams join | vs eos copy | CPU µs per record | goals |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, r := range rows {
		vs := ratiosTo(rows, r, roleStreams, roleStreamsWindow, roleStreamsJoin, roleCopy)
		fmt.Fprintf(w, "| %s | %s | %.2fx | %.2fx | %.2fx | %.2fx | %s | %s |\n", r.v.name, rateCells(r.rates()), vs[0], vs[1], vs[2], vs[3], cpuCell(r), stateGoals(r, vs[0], vs[1], vs[2], vs[3]))
	}
}

// stateGoals is the goals cell of a state row: issue 27's on the row of
// eoskit's count by key, issue 45's on its windowed count's and join's.
func stateGoals(r wrow, vsStreams, vsStreamsWindow, vsStreamsJoin, vsCopy float64) string {
	switch r.v.role {
	case roleWindowGoal:
		return fmt.Sprintf("≥ %.2fx Kafka Streams windowed: %s", goalWindowVsStreams, metOrMissed(vsStreamsWindow >= goalWindowVsStreams))
	case roleJoinGoal:
		return fmt.Sprintf("≥ %.2fx Kafka Streams join: %s", goalJoinVsStreams, metOrMissed(vsStreamsJoin >= goalJoinVsStreams))
	}
	if r.v.role != roleGoal {
		return ""
	}
	return fmt.Sprintf("≥ %.2fx Kafka Streams: %s; ≥ %.2fx copy: %s", goalVsStreams, metOrMissed(vsStreams >= goalVsStreams), goalVsCopy, metOrMissed(vsCopy >= goalVsCopy))
}

// buildStreams finds the Kafka Streams peer's script (scripts/streams.sh),
// resolves Kafka Streams' jars and compiles the peer, once a part, before
// any run (so that no window waits for Maven or javac), and returns the
// script.
func buildStreams(ctx context.Context) (string, error) {
	script, err := srctree.Find("scripts/streams.sh")
	if err != nil {
		return "", fmt.Errorf("the Kafka Streams peer's script: %w (run the bench from the eoskit source tree)", err)
	}
	cmd := exec.CommandContext(ctx, script, "build")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s build: %w", script, err)
	}
	return script, nil
}

// streamsCount starts the Kafka Streams peer (scripts/streams.sh run:
// groupByKey().count() under exactly_once_v2) counting e.in into e.out with
// application.id e.group, which is its consumer group, so the framework
// counts its committed offsets like any other variant's; the JVM's start
// and Streams' rebalance come before its first commit, outside the window.
// When ctx ends it gets SIGTERM (Streams closes, committing what it
// processed, and the peer exits 0); wait then deletes the internal topics
// Streams made (the count's changelog).
func streamsCount(script string, threads int, w window.Spec) func(context.Context, *env) (running, error) {
	var extra []string
	if w.Size > 0 {
		extra = []string{"window-ms=" + strconv.FormatInt(w.Size.Milliseconds(), 10), "grace-ms=" + strconv.FormatInt(w.Grace.Milliseconds(), 10)}
	}
	return streamsPeer(script, threads, extra...)
}

// streamsJoin starts the Kafka Streams peer joining e.in with table
// (stream.join(table)), as streamsCount.
func streamsJoin(script string, threads int, table string) func(context.Context, *env) (running, error) {
	return streamsPeer(script, threads, "table="+table)
}

// streamsArgs are the peer's arguments (scripts/streams.sh run): e's
// brokers, its group as the application id, its input and output, then
// extra.
func streamsArgs(e *env, extra ...string) []string {
	return append([]string{"run", "bootstrap=" + strings.Join(e.brokers, ","), "application-id=" + e.group,
		"input=" + e.in, "output=" + e.out, "replication-factor=" + strconv.Itoa(replicationFactor)}, extra...)
}

// streamsPeer starts the Kafka Streams peer with extra arguments (see
// streamsCount).
func streamsPeer(script string, threads int, extra ...string) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		cmd := exec.CommandContext(ctx, script, streamsArgs(e, append([]string{"threads=" + strconv.Itoa(threads)}, extra...)...)...)
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = 90 * time.Second // Streams' close is given 60 s
		logs := &tail{max: 8 << 10}
		cmd.Stderr = logs
		cmd.Stdout = logs
		if err := cmd.Start(); err != nil {
			return running{}, fmt.Errorf("starting the Kafka Streams peer: %w", err)
		}
		pid := cmd.Process.Pid // streams.sh execs the JVM
		wait := background(func() error {
			err := cmd.Wait()
			if ctx.Err() != nil && cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 0 {
				err = nil // stopped by its SIGTERM, cleanly
			} else if err == nil {
				err = errors.New("exited before it was stopped")
			}
			if err != nil {
				err = fmt.Errorf("Kafka Streams peer: %w; its last output:\n%s", err, logs.String())
			}
			return errors.Join(err, deleteInternalTopics(e.brokers, e.group))
		})
		return running{wait: wait, cpu: func() time.Duration { return pidCPU(pid) }}, nil
	}
}

// benchWindow is the windowed rows' window: tumbling one minute of record
// time, ten seconds of grace (issue 45's goal).
var benchWindow = window.Tumbling(time.Minute, 10*time.Second)

// counting is eos.Processor counting e.in with the aggregation count
// (eos.Count, or eos.WindowedCount of benchWindow) in its keyed state (a
// changelog it creates, the in-memory store), one update per changed key
// per transaction to e.out, committing every interval; wait then deletes
// the changelog.
func counting(count eos.HandlerFunc, interval time.Duration) func(context.Context, *env) (running, error) {
	return countingWith(count, eos.CommitInterval(interval), eos.MaxRecordsPerCommit(maxPerCommit))
}

// countingWith is counting with eos.Processor's defaults but for the
// changelog, the updates topic and opts.
func countingWith(count eos.HandlerFunc, opts ...eos.ProcessorOption) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		p, err := eos.NewProcessor(count, append([]eos.ProcessorOption{eos.Brokers(e.brokers...), eos.Group(e.group), eos.Topics(e.in),
			eos.TransactionalID(e.group + "-0"), eos.Logger(quiet),
			eos.Changelog(e.group+"-changelog", eos.CreateChangelog(), eos.EmitUpdates(e.out))}, opts...)...)
		if err != nil {
			return running{}, err
		}
		return running{wait: background(func() error {
			return errors.Join(p.Run(ctx), deleteInternalTopics(e.brokers, e.group))
		})}, nil
	}
}

// joining is eos.Processor joining e.in with table (eos.JoinTable, its
// table in the keyed state: a changelog it creates, the in-memory store),
// each record's output the table's value of its key, committing every
// interval; wait then deletes the changelog.
func joining(table string, interval time.Duration) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		t := eos.NewTable(table)
		join := eos.JoinTable(t, func(_ context.Context, r *kgo.Record, value []byte, ok bool) ([]*kgo.Record, error) {
			if !ok {
				return nil, nil // an inner join, as Streams'
			}
			return []*kgo.Record{{Topic: e.out, Key: r.Key, Value: value}}, nil
		})
		p, err := eos.NewProcessor(join, eos.Brokers(e.brokers...), eos.Group(e.group), eos.Topics(e.in),
			eos.TransactionalID(e.group+"-0"), eos.CommitInterval(interval), eos.MaxRecordsPerCommit(maxPerCommit), eos.Logger(quiet),
			eos.Changelog(e.group+"-changelog", eos.CreateChangelog()), eos.WithTables(t))
		if err != nil {
			return running{}, err
		}
		return running{wait: background(func() error {
			return errors.Join(p.Run(ctx), deleteInternalTopics(e.brokers, e.group))
		})}, nil
	}
}

// seedJoinTable creates the join rows' table: 6 partitions, a random 100 B
// value for each of the stateKeys keys, stamped an hour ago so that every
// input record (stamped as it is written) meets the whole table.
func (b *bench) seedJoinTable(ctx context.Context) (string, error) {
	table := fmt.Sprintf("bench-state-%d-table", time.Now().UnixNano())
	if err := b.createTopics(ctx, 6, table); err != nil {
		return "", err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.DefaultProduceTopic(table))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	values := randomValues(stateKeys, 100)
	at := time.Now().Add(-time.Hour)
	recs := make([]*kgo.Record, stateKeys)
	for k := range recs {
		recs[k] = &kgo.Record{Key: fmt.Appendf(nil, "k%d", k), Value: values[k], Timestamp: at}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return "", fmt.Errorf("seeding the join's table: %w", err)
	}
	return table, nil
}

// windowedCount is eos.WindowedCount of benchWindow.
func windowedCount() eos.HandlerFunc {
	h, err := eos.WindowedCount(benchWindow)
	if err != nil {
		panic(err) // benchWindow is valid
	}
	return h
}

// deleteInternalTopics deletes the topics a stateful variant made for
// application id (group) app: Kafka Streams' internal topics, eos's
// changelog (their names start with app-).
func deleteInternalTopics(brokers []string, app string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return fmt.Errorf("listing Kafka Streams' internal topics: %w", err)
	}
	var internal []string
	for _, t := range topics.Names() {
		if strings.HasPrefix(t, app+"-") && t != app+"-out" && t != app+"-in" {
			internal = append(internal, t)
		}
	}
	if len(internal) == 0 {
		return nil
	}
	resp, err := adm.DeleteTopics(ctx, internal...)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("deleting Kafka Streams' internal topics: %w", err)
	}
	return nil
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = slices.Clone(t.buf[over:])
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// checkStreams verifies the Kafka Streams peer once, by hand rather than
// by make test: it counts a small backlog of n records over stateKeys keys,
// and once its group has committed the whole input and it has stopped, a
// read_committed reader of its output must see, for every key, counts that
// only grow and end at the input's count of that key, and no other key.
func (b *bench) checkStreams(ctx context.Context, script string, n int) (summary string, err error) {
	group := fmt.Sprintf("bench-state-check-%d", time.Now().UnixNano())
	e := &env{brokers: b.brokers, in: group + "-in", out: group + "-out", group: group}
	if err := b.createTopics(ctx, 6, e.in, e.out); err != nil {
		return "", err
	}
	defer onFail(func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), e.in, e.out) })()
	if err := seed(ctx, b.brokers, e.in, n, 100, stateKeys, false); err != nil {
		return "", fmt.Errorf("seeding: %w", err)
	}
	want, err := readCounts(ctx, e.brokers, e.in, n, nil)
	if err != nil {
		return "", fmt.Errorf("reading the input back: %w", err)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	run, err := streamsCount(script, 1, window.Spec{})(runCtx, e)
	if err != nil {
		return "", err
	}
	progress, progressErr := groupProgress(b.adm, e.group, e.in)
	deadline := time.Now().Add(2 * time.Minute)
	for progress() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	committed := progress()
	stop()
	if err := errors.Join(run.wait(), progressErr()); err != nil {
		return "", err
	}
	if committed != int64(n) {
		return "", fmt.Errorf("the group committed %d of the input's %d records in 2 minutes", committed, n)
	}

	var problems []string
	got, err := readCounts(ctx, e.brokers, e.out, 0, func(key string, count int64, last int64, seen bool) {
		if seen && count <= last && len(problems) < 10 {
			problems = append(problems, fmt.Sprintf("key %s: count %d after %d", key, count, last))
		}
	})
	if err != nil {
		return "", fmt.Errorf("reading the output: %w", err)
	}
	for k, c := range want {
		if got[k] != c && len(problems) < 10 {
			problems = append(problems, fmt.Sprintf("key %s: final count %d, input holds %d", k, got[k], c))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok && len(problems) < 10 {
			problems = append(problems, fmt.Sprintf("key %s: counted, not in the input", k))
		}
	}
	if len(problems) > 0 {
		return "", fmt.Errorf("Kafka Streams' counts are wrong: %s", strings.Join(problems, "; "))
	}
	return fmt.Sprintf("Kafka Streams peer checked: it counted %d records over %d keys, and a read_committed reader of its output saw every key's count grow to the input's count of that key.", n, len(want)), nil
}

// readCounts reads topic read_committed from the start. With n > 0 it
// counts the records per key until it has read n; with n == 0 it keeps
// each key's last count (a big-endian int64 value, Kafka Streams'
// Serdes.Long), calling each (if set) before it replaces one, until the
// topic is idle for 5 s.
func readCounts(ctx context.Context, brokers []string, topic string, n int, each func(key string, count, last int64, seen bool)) (map[string]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	counts := map[string]int64{}
	var read int
	var bad error
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pollCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		fs := cl.PollFetches(pollCtx)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				bad = errors.Join(bad, err)
			}
		})
		if bad != nil {
			return nil, bad
		}
		fs.EachRecord(func(r *kgo.Record) {
			read++
			k := string(r.Key)
			if n > 0 {
				counts[k]++
				return
			}
			if len(r.Value) != 8 {
				bad = fmt.Errorf("key %s: a %d-byte value, not a count", k, len(r.Value))
				return
			}
			c := int64(binary.BigEndian.Uint64(r.Value))
			last, seen := counts[k]
			if each != nil {
				each(k, c, last, seen)
			}
			counts[k] = c
		})
		if bad != nil {
			return nil, bad
		}
		switch {
		case n > 0 && read >= n:
			return counts, nil
		case n == 0 && fs.NumRecords() == 0 && read > 0:
			return counts, nil // idle for 5 s
		case time.Now().After(deadline):
			return nil, fmt.Errorf("read %d records of %s in 2 minutes", read, topic)
		}
	}
}

// state runs the state part: it builds the Kafka Streams peer, measures the
// state table, prints it and, if check, checks the peer's counts once.
func (b *bench) state(ctx context.Context, w io.Writer, threads int, check bool) error {
	script, err := buildStreams(ctx)
	if err != nil {
		return err
	}
	table, err := b.seedJoinTable(ctx)
	if err != nil {
		return err
	}
	defer func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), table) }()
	rows, err := b.windowed(ctx, stateTable(script, threads, table))
	if err != nil {
		return err
	}
	printState(w, rows, b)
	if !check {
		return nil
	}
	summary, err := b.checkStreams(ctx, script, stateCheckRecords)
	if err != nil {
		return fmt.Errorf("checking the Kafka Streams peer: %w", err)
	}
	fmt.Fprintf(w, "\n%s\n", summary)
	return nil
}

// stateCheckRecords is the size of the backlog checkStreams counts: enough
// for every key to be counted many times, little enough to drain in seconds.
const stateCheckRecords = 20_000
