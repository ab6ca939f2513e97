package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/window"
)

// The backlog part (issue 45): the count by key timed as a user meets it,
// from each variant's start to its group's commit of a backlog's last
// record, start-up included (Kafka Streams' JVM and its group's join;
// eos.Processor, run inside the benchmark process, its group's join and
// its changelog's creation): eos.Count with eos.Processor's defaults (the
// row the goal is about), with fewer and with more records per commit, against Kafka
// Streams with one stream thread and with two. The windowed table above measures the pace after a
// warm-up instead; the two differ by what the start costs each, and by
// what a thread more gives Streams. make bench runs it after the state
// part; -only backlog alone.

// goalBacklogVsStreams is issue 45's goal for eos.Count's wall clock
// against the better of Kafka Streams with one and with two stream
// threads.
const goalBacklogVsStreams = 2.0

// backlogRow is one variant's runs over the backlog.
type backlogRow struct {
	name    string
	streams bool // a Kafka Streams peer: the better of these is the base
	graded  bool // the row the goal is about
	start   func(ctx context.Context, e *env) (running, error)
	took    []time.Duration
	first   []time.Duration // from the start to the first commit
}

// backlogWallClock seeds a backlog of n records (100 B random values over
// stateKeys keys, 6 partitions) and times each variant b.runs times,
// interleaved, from its start until its group has committed every record.
func (b *bench) backlogWallClock(ctx context.Context, w io.Writer, n int) error {
	script, err := buildStreams(ctx)
	if err != nil {
		return err
	}
	in := fmt.Sprintf("bench-backlog-%d-in", time.Now().UnixNano())
	if err := b.createTopics(ctx, 6, in); err != nil {
		return err
	}
	defer func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), in) }()
	fmt.Fprintf(os.Stderr, "backlog: seeding %d records of 100 B over %d keys\n", n, stateKeys)
	seeded := time.Now()
	if err := seed(ctx, b.brokers, in, n, 100, stateKeys, false); err != nil {
		return fmt.Errorf("seeding the backlog: %w", err)
	}
	fmt.Fprintf(os.Stderr, "backlog: seeded in %s\n", time.Since(seeded).Round(time.Millisecond))
	// The end the group's committed offsets must reach: the topic's end
	// offsets (the seed is not transactional: no marker among them).
	ends, err := b.adm.ListEndOffsets(ctx, in)
	if err != nil {
		return fmt.Errorf("the backlog's end offsets: %w", err)
	}
	var end int64
	ends.Each(func(o kadm.ListedOffset) { end += o.Offset })
	if end != int64(n) {
		return fmt.Errorf("the backlog ends at %d records in all, not the %d seeded", end, n)
	}
	rows := []backlogRow{
		{name: "eos.Count with eos.Processor's defaults (100ms commits, 100,000 records per commit)", graded: true, start: countingWith(eos.Count())},
		{name: "eos.Count, 10,000 records per commit (the default until 2026-12-06)", start: countingWith(eos.Count(), eos.MaxRecordsPerCommit(10_000))},
		{name: "eos.Count, 1,000,000 records per commit (the state table's)", start: countingWith(eos.Count(), eos.MaxRecordsPerCommit(maxPerCommit))},
		{name: "Kafka Streams count, 1 stream thread", streams: true, start: streamsCount(script, 1, window.Spec{})},
		{name: "Kafka Streams count, 2 stream threads", streams: true, start: streamsCount(script, 2, window.Spec{})},
	}
	for r := range b.runs {
		for i := range rows {
			row := &rows[i]
			group := fmt.Sprintf("bench-backlog-%d-%d-%d", time.Now().UnixNano(), r, i)
			e := &env{brokers: b.brokers, in: in, out: group + "-out", group: group}
			if err := b.createTopics(ctx, 6, e.out); err != nil {
				return err
			}
			took, first, err := b.drain(ctx, row.start, e, int64(n))
			_, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), e.out)
			if err != nil {
				return fmt.Errorf("%s: %w", row.name, err)
			}
			row.took, row.first = append(row.took, took), append(row.first, first)
			fmt.Fprintf(os.Stderr, "  run %d  %-45s %8s (first commit after %s)  %8.0f records/s\n", r+1, row.name,
				took.Round(time.Millisecond), first.Round(time.Millisecond), float64(n)/took.Seconds())
		}
	}
	printBacklog(w, rows, n, b.runs)
	return nil
}

// drain starts a variant on e and returns how long it took from its
// start to commit all n records of e.in, and to its first commit. It
// gives up past a pace of 20,000 records a second, plus a minute, and as
// soon as the variant ends on its own (a JVM that died, a Run that
// failed).
func (b *bench) drain(ctx context.Context, start func(context.Context, *env) (running, error), e *env, n int64) (took, first time.Duration, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	progress, failed := groupProgress(b.adm, e.group, e.in)
	began := time.Now()
	run, err := start(ctx, e)
	if err != nil {
		return 0, 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- run.wait() }()
	stop := func() error {
		cancel()
		if err := <-exited; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	deadline := time.NewTimer(time.Until(began.Add(time.Minute + time.Duration(n/20_000)*time.Second)))
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		done := progress()
		if done > 0 && first == 0 {
			first = time.Since(began)
		}
		if done >= n {
			return time.Since(began), first, stop()
		}
		if err := failed(); err != nil {
			return 0, 0, errors.Join(err, stop())
		}
		select {
		case err := <-exited:
			return 0, 0, fmt.Errorf("it ended with %d of %d records committed: %v", done, n, err)
		case <-deadline.C:
			return 0, 0, errors.Join(fmt.Errorf("%d of %d records committed after %s", done, n, time.Since(began).Round(time.Second)), stop())
		case <-ctx.Done():
			return 0, 0, errors.Join(ctx.Err(), stop())
		case <-tick.C:
		}
	}
}

// printBacklog writes the backlog table: each variant's median wall clock,
// its first commit and what followed it, and its ratio to the better
// Kafka Streams row (by median wall clock); the goal is the graded row's
// (eos.Processor's defaults, what a user runs first).
func printBacklog(w io.Writer, rows []backlogRow, n, runs int) {
	best := time.Duration(0)
	for _, r := range rows {
		if m := medianDuration(r.took); r.streams && (best == 0 || m < best) {
			best = m
		}
	}
	fmt.Fprintf(w, "\nbacklog, count by key timed as a user times it: %d records of 100 B, 6 partitions, %d keys, each variant from its start to its group's commit of the last record (Kafka Streams: the JVM's start and the group's join included; eos: started inside the running benchmark process, the group's join and the changelog's creation included); Kafka Streams with its defaults (RocksDB store, 10 MiB cache, 100 ms commits), eos with a memory store; median of %d interleaved runs (min-max). Goal for eos.Count with eos.Processor's defaults: ≥ %.2fx the better Kafka Streams row (at this backlog: a smaller one weighs the JVM's start more)\n\n",
		n, stateKeys, runs, goalBacklogVsStreams)
	fmt.Fprintln(w, "| variant | wall clock | min-max | first commit after | after the first commit | records/s, start included | vs the better Kafka Streams | goal |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, r := range rows {
		m, f := medianDuration(r.took), medianDuration(r.first)
		lo, hi := r.took[0], r.took[0]
		for _, d := range r.took {
			lo, hi = min(lo, d), max(hi, d)
		}
		vs := best.Seconds() / m.Seconds()
		goal := ""
		if r.graded {
			goal = fmt.Sprintf("≥ %.2fx: %s", goalBacklogVsStreams, metOrMissed(vs >= goalBacklogVsStreams))
		}
		fmt.Fprintf(w, "| %s | %s | %s-%s | %s | %s | %.0f | %.2fx | %s |\n", r.name, m.Round(10*time.Millisecond),
			lo.Round(10*time.Millisecond), hi.Round(10*time.Millisecond), f.Round(10*time.Millisecond),
			(m - f).Round(10*time.Millisecond), float64(n)/m.Seconds(), vs, goal)
	}
}
