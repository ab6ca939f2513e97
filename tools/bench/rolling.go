package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The rolling table (issue 46's goal): one of three instances counting
// by key leaves, as a rolling restart's SIGTERM makes it, and its
// partitions move to the two others. Timed from the SIGTERM to the first
// transaction each moved partition commits under its new owner (the
// group's committed offset past where the leaver's last commit left it),
// with the restores the new owners made of the moved partitions (their
// records, and the longest one's time: the rest of the time is the
// leave, the group's rebalance and the first transaction). Each run has an
// input of its own, filled once the three instances hold partitions:
// keys records with a key each over 6 partitions, then 1,000 records a
// second; the instances have counted the backlog and run 5 s more (the
// standbys caught up) before the leave, that of the first instance
// holding partitions. eos.Processor (dynamic members
// with an Endpoint each, as Standbys needs; memory and pebble stores; no
// standbys, one, two) against Kafka Streams 4.4's count by key (RocksDB,
// num.standby.replicas 0 and 1, each instance closing with LEAVE_GROUP as
// eos.Processor's close leaves). Goals, with one standby: every moved
// partition within 5 s; ≥ 5x faster than without standbys; no slower than
// Kafka Streams with one.
const (
	goalRollingWithin    = 5 * time.Second
	goalRollingVsNone    = 5.0
	goalRollingVsStreams = 1.0
)

type rollingVariant struct {
	name     string
	streams  bool
	store    string // eos: "memory" or "pebble"
	standbys int
}

type rollingRun struct {
	all      time.Duration // from the SIGTERM to the last moved partition's first commit
	restored int           // records the new owners restored of the moved partitions
	longest  time.Duration // the longest of those restores
}

// rolling runs the rolling table over an input of keys keys.
func (b *bench) rolling(ctx context.Context, w io.Writer, keys int) error {
	script, err := buildStreams(ctx)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	app := "bench-rolling-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	dir, err := os.MkdirTemp("", "eoskit-bench-rolling-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	variants := []rollingVariant{
		{"eos.Processor, memory store, Standbys(1)", false, "memory", 1},
		{"eos.Processor, memory store, no standby", false, "memory", 0},
		{"eos.Processor, memory store, Standbys(2)", false, "memory", 2},
		{"eos.Processor, pebble store, Standbys(1)", false, "pebble", 1},
		{"eos.Processor, pebble store, no standby", false, "pebble", 0},
		{"Kafka Streams 4.4, RocksDB, num.standby.replicas=1", true, "", 1},
		{"Kafka Streams 4.4, RocksDB, no standby", true, "", 0},
	}
	runs := make([][]rollingRun, len(variants))
	for round := range b.runs {
		for _, i := range rotated(len(variants), round) {
			v := variants[i]
			group := fmt.Sprintf("%s-%d-%d", app, i, round)
			r, err := b.rollingRun(ctx, self, script, v, group, filepath.Join(dir, group), keys)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			runs[i] = append(runs[i], r)
			fmt.Fprintf(os.Stderr, "bench: rolling: %s: moved partitions committed %s after the leave; %d records restored, the longest restore %s\n",
				v.name, r.all.Round(time.Millisecond), r.restored, r.longest.Round(time.Millisecond))
		}
	}

	all := func(i int) time.Duration {
		var ds []time.Duration
		for _, r := range runs[i] {
			ds = append(ds, r.all)
		}
		return medianDuration(ds)
	}
	find := func(streams bool, store string, standbys int) int {
		return slices.IndexFunc(variants, func(v rollingVariant) bool {
			return v.streams == streams && v.store == store && v.standbys == standbys
		})
	}
	streamsOne := all(find(true, "", 1))
	fmt.Fprintf(w, "\nrolling restart, one of three instances leaving: each counts by key (eos.Count; Kafka Streams' groupByKey().count()) an input of %d records with a key each over %d partitions, %d records a second coming; each run on an input of its own, filled once all three hold partitions; once the backlog is counted and 5 s more have passed, one instance gets SIGTERM and leaves the group; from the SIGTERM to the first transaction each of its partitions commits under its new owner (the group's committed offsets, polled every 20 ms), with what the new owners restored of those partitions; median of %d interleaved runs (min-max). Goals, with one standby: within %s, ≥ %.0fx faster than without, no slower than Kafka Streams with one\n\n",
		keys, restorePartitions, restartRate, b.runs, goalRollingWithin, goalRollingVsNone)
	fmt.Fprintln(w, "| variant | leave to every moved partition's commit (median) | min-max | records restored (median) | longest restore (median) | vs no standby, same store | vs Kafka Streams, one standby | goals |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for i, v := range variants {
		var ds, longest []time.Duration
		var restored []float64
		for _, r := range runs[i] {
			ds, longest, restored = append(ds, r.all), append(longest, r.longest), append(restored, float64(r.restored))
		}
		none := all(find(v.streams, v.store, 0))
		goals := ""
		if !v.streams && v.standbys == 1 {
			goals = fmt.Sprintf("≤ %s: %s; ≥ %.0fx: %s; ≥ %.0fx Streams: %s",
				goalRollingWithin, metOrMissed(all(i) <= goalRollingWithin),
				goalRollingVsNone, metOrMissed(float64(none)/float64(all(i)) >= goalRollingVsNone),
				goalRollingVsStreams, metOrMissed(float64(streamsOne)/float64(all(i)) >= goalRollingVsStreams))
		}
		fmt.Fprintf(w, "| %s | %s | %s-%s | %.0f | %s | %.2fx | %.2fx | %s |\n", v.name, all(i).Round(time.Millisecond),
			slices.Min(ds).Round(time.Millisecond), slices.Max(ds).Round(time.Millisecond), median(restored),
			medianDuration(longest).Round(time.Millisecond), float64(none)/float64(all(i)), float64(streamsOne)/float64(all(i)), goals)
	}
	return nil
}

// rollingRun starts three instances of v in group, lets them count the
// backlog, makes one leave and times its partitions' move.
func (b *bench) rollingRun(ctx context.Context, self, script string, v rollingVariant, group, dir string, keys int) (rollingRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	defer func() { _ = deleteInternalTopics(b.brokers, group) }()
	// A fresh input per run, filled once the group is stable with its
	// three members: Kafka Streams' assignor balances tasks whose state
	// is empty at once, but gives a member that joins behind a caught-up
	// one only warm-ups, for up to its probing interval (10 min).
	in, out := group+"-in", group+"-out"
	if err := b.createTopics(ctx, restorePartitions, in, out); err != nil {
		return rollingRun{}, err
	}
	defer func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), in, out) }()
	names := []string{"a", "b", "c"}
	instances := make([]*child, 0, len(names))
	defer func() {
		for _, c := range instances {
			_ = c.stop()
		}
	}()
	// marker is what the group's description shows of each instance's
	// client id.
	marker := func(name string) string {
		if v.streams {
			return group + "-" + name + "-StreamThread"
		}
		return "//" + name + ".bench.invalid"
	}
	for _, name := range names {
		var cmd *exec.Cmd
		if v.streams {
			cmd = exec.CommandContext(ctx, script, streamsArgs(&env{brokers: b.brokers, group: group, in: in, out: out},
				"client-id="+group+"-"+name, "standbys="+strconv.Itoa(v.standbys), "leave-group=true", "log-restores=true")...)
		} else {
			cmd = exec.CommandContext(ctx, self)
			cmd.Env = counter{brokers: b.brokers, group: group, in: in, changelog: group + "-changelog", store: v.store,
				dir: filepath.Join(dir, name), txn: group + "-" + name, endpoint: "http:" + marker(name), standbys: v.standbys}.env()
		}
		c, err := startCmd(cmd)
		if err != nil {
			return rollingRun{}, err
		}
		instances = append(instances, c)
	}

	holding := func() ([][]int32, bool) {
		described, err := b.adm.DescribeGroups(ctx, group)
		if err != nil {
			return nil, false
		}
		g := described[group]
		if g.State != "Stable" || len(g.Members) != len(names) {
			return nil, false
		}
		held := make([][]int32, len(names))
		for _, m := range g.Members {
			ca, ok := m.Assigned.AsConsumer()
			if !ok {
				continue
			}
			for i, name := range names {
				if strings.Contains(m.ClientID, marker(name)) {
					for _, t := range ca.Topics {
						if t.Topic == in {
							held[i] = append(held[i], t.Partitions...)
						}
					}
				}
			}
		}
		return held, true
	}
	if err := waitUntil(ctx, instances, "the group to be stable with every member holding partitions", func() bool {
		held, stable := holding()
		return stable && !slices.ContainsFunc(held, func(ps []int32) bool { return len(ps) == 0 })
	}); err != nil {
		return rollingRun{}, err
	}
	if err := seed(ctx, b.brokers, in, keys, restoreValue, 0, false); err != nil {
		return rollingRun{}, err
	}
	backlog, err := endOffsets(ctx, b.adm, in)
	if err != nil {
		return rollingRun{}, err
	}
	produce, stopProducing := context.WithCancel(ctx)
	produced := produceSteadily(produce, b.brokers, in, restartRate)
	defer func() { stopProducing(); _ = produced() }()
	committed := func() (map[int32]int64, error) { return committedOffsets(ctx, b.adm, group, in) }
	if err := waitUntil(ctx, instances, "the instances to count the backlog", func() bool {
		at, err := committed()
		return err == nil && reached(at, backlog)
	}); err != nil {
		return rollingRun{}, err
	}
	time.Sleep(5 * time.Second) // the standbys catch up
	// The leaver: the first instance that holds partitions, the group
	// stable (the counting moved nothing, or settled).
	var moved []int32
	leaver := -1
	if err := waitUntil(ctx, instances, "the group to be stable with its three members", func() bool {
		held, stable := holding()
		leaver = slices.IndexFunc(held, func(ps []int32) bool { return len(ps) > 0 })
		if stable && leaver >= 0 {
			moved = held[leaver]
		}
		return stable && leaver >= 0
	}); err != nil {
		return rollingRun{}, err
	}

	leave := time.Now()
	if err := instances[leaver].stop(); err != nil {
		return rollingRun{}, fmt.Errorf("the leaving instance: %w", err)
	}
	atExit, err := committed()
	if err != nil {
		return rollingRun{}, err
	}
	survivors := slices.Delete(slices.Clone(instances), leaver, leaver+1)
	if err := waitUntil(ctx, survivors, "every moved partition to commit under its new owner", func() bool {
		at, err := committed()
		if err != nil {
			return false
		}
		for _, p := range moved {
			if at[p] <= atExit[p] {
				return false
			}
		}
		return true
	}); err != nil {
		return rollingRun{}, err
	}
	r := rollingRun{all: time.Since(leave)}
	for _, c := range survivors {
		for _, l := range c.lines.since(leave) {
			if slices.Contains(moved, l.partition) {
				r.restored += l.records
				r.longest = max(r.longest, l.took)
			}
		}
	}
	return r, nil
}

// waitUntil polls cond every 20 ms until it holds, ctx ends (an error
// saying what it waited for) or one of instances exits (an error with its
// output).
func waitUntil(ctx context.Context, instances []*child, what string, cond func() bool) error {
	for !cond() {
		for _, c := range instances {
			select {
			case <-c.exited:
				return fmt.Errorf("an instance exited while waiting for %s:\n%s", what, c.logs.String())
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
