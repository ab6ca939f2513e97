package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/state/pebblestore"
)

// The assigned-restore table of the restore part (issue 46's goal: a
// newly assigned partition set restores at ≥ 2x Kafka Streams' rate): a
// processor that joins a group with nothing on its disk gets every
// partition of a filled changelog and restores them all, as a failover to
// a new instance does. Kafka Streams 4.4 (the bench peer's count by key,
// RocksDB and its in-memory store) and eos.Processor (eos.Count, memory
// and pebble stores) restore one and the same changelog: the peer's store
// "counts" of application id app has the changelog app-counts-changelog,
// which the bench fills before either starts and eos.Changelog names.
// Each run is a fresh process (Streams, with a fresh state directory) or
// processor (a fresh group and pebble directory); a restore's span runs
// from the first partition's restore start to the last one's end (Streams'
// StateRestoreListener; eoskit's RestoreMetrics, each end less its took),
// and "from start" from KafkaStreams.start() or Run to that end (the
// group's join and the processor's checks included, the JVM's start not).
const goalAssignedVsStreams = 2.0

// assignedVariant is one way of restoring the changelog; run returns the
// records restored, the restore's span and the time from start to its
// end.
type assignedVariant struct {
	name string
	// streams marks Kafka Streams' rows; kind pairs a row with the peer
	// row of the same kind of store ("memory" or "disk").
	streams bool
	kind    string
	run     func(ctx context.Context, round int) (assignedRun, error)
}

type assignedRun struct {
	records         int
	span, fromStart time.Duration
}

// assignedRestore runs the table over a changelog of keys keys.
func (b *bench) assignedRestore(ctx context.Context, w io.Writer, keys int) error {
	script, err := buildStreams(ctx)
	if err != nil {
		return err
	}
	app := "bench-assigned-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	e := &env{brokers: b.brokers, in: app + "-in", out: app + "-out", group: app}
	changelogTopic := app + "-counts-changelog"
	if err := b.createTopics(ctx, restorePartitions, e.in, e.out); err != nil {
		return err
	}
	compact := "compact"
	if _, err := b.adm.CreateTopic(ctx, restorePartitions, -1, map[string]*string{"cleanup.policy": &compact}, changelogTopic); err != nil {
		return fmt.Errorf("create %s: %w", changelogTopic, err)
	}
	defer func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), e.in, e.out, changelogTopic) }()
	counts, err := b.fillChangelog(ctx, changelogTopic, keys)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "eoskit-bench-assigned-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	eosRestore := func(stores func(round int) state.Factory) func(context.Context, int) (assignedRun, error) {
		return func(ctx context.Context, round int) (assignedRun, error) {
			return eosAssigned(ctx, e, changelogTopic, fmt.Sprintf("%s-eos-%d-%d", app, round, time.Now().UnixNano()), stores(round))
		}
	}
	variants := []assignedVariant{
		{"Kafka Streams 4.4, RocksDB (its default store)", true, "disk", func(ctx context.Context, _ int) (assignedRun, error) {
			return streamsAssigned(ctx, script, e)
		}},
		{"Kafka Streams 4.4, its in-memory store", true, "memory", func(ctx context.Context, _ int) (assignedRun, error) {
			return streamsAssigned(ctx, script, e, "store=memory")
		}},
		{"eos.Processor, memory store", false, "memory", eosRestore(func(int) state.Factory { return state.MemoryFactory() })},
		{"eos.Processor, pebble store (a new disk; 16 MiB memtables, its default)", false, "disk", eosRestore(func(round int) state.Factory {
			return pebblestore.Factory(filepath.Join(dir, strconv.Itoa(round)), nil)
		})},
		// What bounds pebble: its memtable flushed again and again as a
		// partition of about 22 MB restores. Pebble's own default, and
		// one larger than a partition.
		{"eos.Processor, pebble store, 4 MiB memtables (pebble's default)", false, "disk", eosRestore(func(round int) state.Factory {
			return pebblestore.Factory(filepath.Join(dir, strconv.Itoa(round)+"-4"), &pebble.Options{MemTableSize: 4 << 20, Logger: pebbleQuiet{}})
		})},
		{"eos.Processor, pebble store, 64 MiB memtables (pebble.Options)", false, "disk", eosRestore(func(round int) state.Factory {
			return pebblestore.Factory(filepath.Join(dir, strconv.Itoa(round)+"-64"), &pebble.Options{MemTableSize: 64 << 20, Logger: pebbleQuiet{}})
		})},
	}
	runs := make([][]assignedRun, len(variants))
	for round := range b.runs {
		for i, v := range variants {
			r, err := v.run(ctx, round)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			if r.records != total(counts) {
				return fmt.Errorf("%s: restored %d records, the changelog holds %d", v.name, r.records, total(counts))
			}
			runs[i] = append(runs[i], r)
			fmt.Fprintf(os.Stderr, "bench: assigned restore: %s: %d records in %s (%s from start)\n",
				v.name, r.records, r.span.Round(time.Millisecond), r.fromStart.Round(time.Millisecond))
		}
	}

	rates := func(i int) []float64 {
		var rs []float64
		for _, r := range runs[i] {
			rs = append(rs, float64(r.records)/r.span.Seconds())
		}
		return rs
	}
	streamsBest, streamsKind := 0.0, map[string]float64{}
	for i, v := range variants {
		if v.streams {
			streamsKind[v.kind] = median(rates(i))
			streamsBest = max(streamsBest, median(rates(i)))
		}
	}
	fmt.Fprintf(w, "\nrestore of a newly assigned partition set: one member with nothing on its disk joins a group and gets all %d partitions of a filled changelog (%d keys, %d B random values, written in transactions), which Kafka Streams and eos.Processor each restore whole, the same topic; median of %d interleaved runs (min-max; spread = (max-min)/median). The span runs from the first partition's restore start to the last one's end; \"from start\" from KafkaStreams.start() or Run to that end (the group's join included, the JVM's start not). Ratios to Kafka Streams' row of the same kind of store (memory, disk) and to the better of its two. Goal: eos.Processor's rate ≥ %.1fx the better of Kafka Streams' two\n\n",
		restorePartitions, keys, restoreValue, b.runs, goalAssignedVsStreams)
	fmt.Fprintln(w, "| variant | records | span (median) | records/s | min-max | spread | from start (median) | vs Kafka Streams, same kind | vs Kafka Streams' better | goal |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for i, v := range variants {
		rs := rates(i)
		var spans, fromStart []time.Duration
		for _, r := range runs[i] {
			spans, fromStart = append(spans, r.span), append(fromStart, r.fromStart)
		}
		goal := ""
		if !v.streams {
			goal = fmt.Sprintf("≥ %.1fx: %s", goalAssignedVsStreams, metOrMissed(median(rs)/streamsBest >= goalAssignedVsStreams))
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %.2fx | %.2fx | %s |\n", v.name, runs[i][0].records,
			medianDuration(spans).Round(time.Millisecond), rateCells(rs), medianDuration(fromStart).Round(time.Millisecond),
			median(rs)/streamsKind[v.kind], median(rs)/streamsBest, goal)
	}
	return nil
}

// streamsAssigned runs the Kafka Streams peer counting e.in with
// application id e.group (so its store's changelog is the filled one)
// until it has restored every partition (restored-exit), and reads the
// line it prints then.
func streamsAssigned(ctx context.Context, script string, e *env, extra ...string) (assignedRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, script, streamsArgs(e, append([]string{"restored-exit=" + strconv.Itoa(restorePartitions)}, extra...)...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 90 * time.Second
	logs := &tail{max: 8 << 10}
	cmd.Stderr = logs
	out, err := cmd.Output()
	if err != nil {
		return assignedRun{}, fmt.Errorf("Kafka Streams peer: %w; its last output:\n%s", err, logs.String())
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var r assignedRun
		var span, fromStart float64
		if _, err := fmt.Sscanf(sc.Text(), "restored records=%d span_ms=%g from_start_ms=%g", &r.records, &span, &fromStart); err == nil {
			r.span = time.Duration(span * float64(time.Millisecond))
			r.fromStart = time.Duration(fromStart * float64(time.Millisecond))
			return r, nil
		}
	}
	return assignedRun{}, fmt.Errorf("Kafka Streams peer printed no restore line; its output:\n%s\n%s", out, logs.String())
}

// eosAssigned runs eos.Processor counting e.in in group with the
// changelog topic and stores until every partition has been restored
// (its RestoreMetrics), then stops it.
func eosAssigned(ctx context.Context, e *env, topic, group string, stores state.Factory) (assignedRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	clock := &restoreClock{done: make(chan struct{}), partitions: restorePartitions}
	p, err := eos.NewProcessor(eos.Count(), eos.Brokers(e.brokers...), eos.Group(group), eos.Topics(e.in),
		eos.TransactionalID(group), eos.Logger(quiet), eos.WithMetrics(clock),
		eos.Changelog(topic, eos.Stores(stores)))
	if err != nil {
		return assignedRun{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()
	select {
	case <-clock.done:
		stop()
		if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
			return assignedRun{}, err
		}
	case err := <-ran:
		return assignedRun{}, fmt.Errorf("Run returned before every partition was restored: %w", err)
	case <-ctx.Done():
		stop()
		err := <-ran
		clock.mu.Lock()
		defer clock.mu.Unlock()
		return assignedRun{}, errors.Join(fmt.Errorf("restored %d of %d partitions within 5 minutes", clock.ended, restorePartitions), err)
	}
	clock.mu.Lock()
	defer clock.mu.Unlock()
	return assignedRun{records: clock.records, span: clock.last.Sub(clock.first), fromStart: clock.last.Sub(start)}, nil
}

// restoreClock is an eoskit.Metrics observing eos's restores
// (eos.RestoreMetrics): when partitions have been restored it closes done.
type restoreClock struct {
	eoskit.NopMetrics
	mu          sync.Mutex
	partitions  int
	ended       int
	records     int
	first, last time.Time
	done        chan struct{}
}

func (c *restoreClock) Restored(_ string, _ int32, _ int64, records int, took time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if began := now.Add(-took); c.first.IsZero() || began.Before(c.first) {
		c.first = began
	}
	c.last, c.records = now, c.records+records
	if c.ended++; c.ended == c.partitions {
		close(c.done)
	}
}

var _ eos.RestoreMetrics = (*restoreClock)(nil)

// pebbleQuiet drops pebble's informational messages ("Found 0 WALs"),
// which would land among the bench's progress lines; errors stay.
type pebbleQuiet struct{}

func (pebbleQuiet) Infof(string, ...any) {}
func (pebbleQuiet) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
}
func (pebbleQuiet) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
	os.Exit(1)
}
