package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/state/pebblestore"
)

// The restart table (issue 46's goal): a counting instance SIGKILLed and
// started again on the same machine. It counts by key (eos.Count) an
// input of keys records, each with a key of its own, over 6 partitions,
// while a producer adds 1,000 records a second; once it has counted the
// backlog (its state holds every key) and run 2 s more, it is SIGKILLed
// and started again at once, the same process with the same settings.
// Timed from the restart (the process's start) to the first transaction
// each partition commits after it (the group's committed offset past where
// the kill left it): with the same InstanceID and pebble directory (the
// goal: every partition within 3 s, its restore the changelog's tail past
// the checkpoint the kill left); on memory stores (a whole restore); and
// on pebble with no InstanceID (a dynamic member: the group first waits
// out the dead member's session timeout, franz-go's default 45 s).
const goalRestart = 3 * time.Second

// restartRate is what the producer adds to the input while the instance
// counts, is killed and restarts.
const restartRate = 1000

// childEnv names, in a child's environment, what the bench process runs as
// a child: "count" (runChild).
const childEnv = "EOSKIT_BENCH_CHILD"

type restartVariant struct {
	name     string
	store    string // "memory" or "pebble"
	instance bool   // eos.InstanceID
	goal     bool
}

type restartRun struct {
	first, all time.Duration // from the restart to the first and the last partition's first commit
	restored   int           // changelog records the restart restored
}

// restart runs the restart table over an input of keys keys.
func (b *bench) restart(ctx context.Context, w io.Writer, keys int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	app := "bench-restart-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	in := app + "-in"
	if err := b.createTopics(ctx, restorePartitions, in); err != nil {
		return err
	}
	defer func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), in) }()
	if err := seed(ctx, b.brokers, in, keys, restoreValue, 0, false); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "eoskit-bench-restart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	variants := []restartVariant{
		{"pebble store, eos.InstanceID (a static member)", "pebble", true, true},
		{"memory store, eos.InstanceID (a whole restore)", "memory", true, false},
		{"pebble store, no InstanceID (a dynamic member)", "pebble", false, false},
	}
	runs := make([][]restartRun, len(variants))
	for round := range b.runs {
		for _, i := range rotated(len(variants), round) {
			v := variants[i]
			group := fmt.Sprintf("%s-%s-%d", app, slug(v.name), round)
			r, err := b.restartRun(ctx, self, v, in, group, filepath.Join(dir, group), keys)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			runs[i] = append(runs[i], r)
			fmt.Fprintf(os.Stderr, "bench: restart: %s: first partition %s, every partition %s, %d changelog records restored\n",
				v.name, r.first.Round(time.Millisecond), r.all.Round(time.Millisecond), r.restored)
		}
	}

	fmt.Fprintf(w, "\nrestart after a SIGKILL: an instance counting by key (eos.Count) an input of %d records with a key each over %d partitions, %d records a second coming, SIGKILLed 2 s after it has counted the backlog and started again at once with the same settings; from the restart to each partition's first committed transaction after it (the group's committed offsets, polled every 20 ms), and the changelog records the restart restored; median of %d interleaved runs (min-max). Goal: with eos.InstanceID and a pebble store, every partition within %s\n\n",
		keys, restorePartitions, restartRate, b.runs, goalRestart)
	fmt.Fprintln(w, "| variant | first partition (median) | every partition (median) | min-max | records restored (median) | goal |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | --- |")
	for i, v := range variants {
		var first, all []time.Duration
		var restored []float64
		for _, r := range runs[i] {
			first, all, restored = append(first, r.first), append(all, r.all), append(restored, float64(r.restored))
		}
		goal := ""
		if v.goal {
			goal = fmt.Sprintf("≤ %s: %s", goalRestart, metOrMissed(medianDuration(all) <= goalRestart))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s-%s | %.0f | %s |\n", v.name, medianDuration(first).Round(time.Millisecond),
			medianDuration(all).Round(time.Millisecond), slices.Min(all).Round(time.Millisecond), slices.Max(all).Round(time.Millisecond),
			median(restored), goal)
	}
	return nil
}

// restartRun counts in with a child process in group, kills it once it
// has counted the backlog, starts it again and times the restart.
func (b *bench) restartRun(ctx context.Context, self string, v restartVariant, in, group, dir string, keys int) (restartRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	changelog := group + "-changelog"
	defer func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), changelog) }()
	produce, stopProducing := context.WithCancel(ctx)
	produced := produceSteadily(produce, b.brokers, in, restartRate)
	defer func() { stopProducing(); _ = produced() }()

	c := counter{brokers: b.brokers, group: group, in: in, changelog: changelog, store: v.store, dir: dir}
	if v.instance {
		c.instance = "0"
	}
	env := c.env()
	backlog, err := endOffsets(ctx, b.adm, in)
	if err != nil {
		return restartRun{}, err
	}
	first, err := startChild(ctx, self, env)
	if err != nil {
		return restartRun{}, err
	}
	counted := func() (map[int32]int64, error) { return committedOffsets(ctx, b.adm, group, in) }
	if err := waitUntil(ctx, []*child{first}, "the counter to count the backlog", func() bool {
		at, err := counted()
		return err == nil && reached(at, backlog)
	}); err != nil {
		first.kill()
		return restartRun{}, err
	}
	time.Sleep(2 * time.Second) // past a sync of each store's log, commits coming all along
	first.kill()
	atKill, err := counted()
	if err != nil {
		return restartRun{}, err
	}

	start := time.Now()
	second, err := startChild(ctx, self, env)
	if err != nil {
		return restartRun{}, err
	}
	defer second.stop()
	var r restartRun
	moved := map[int32]bool{}
	if err := waitUntil(ctx, []*child{second}, "every partition to commit after the restart", func() bool {
		at, _ := counted()
		for p, o := range at {
			if o > atKill[p] && !moved[p] {
				moved[p] = true
				if len(moved) == 1 {
					r.first = time.Since(start)
				}
			}
		}
		return len(moved) == restorePartitions
	}); err != nil {
		return restartRun{}, err
	}
	r.all = time.Since(start)
	if err := second.stop(); err != nil {
		return restartRun{}, err
	}
	r.restored = second.restored()
	return r, nil
}

// endOffsets returns topic's end offsets, per partition.
func endOffsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, error) {
	listed, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	ends := map[int32]int64{}
	listed.Each(func(o kadm.ListedOffset) { ends[o.Partition] = o.Offset })
	return ends, nil
}

// committedOffsets returns group's committed offsets of topic's
// partitions, stable (kadm.RequireStable: not while a transaction that
// commits offsets is pending, whose commit would show later), trying
// again for up to 10 s while a partition's is not.
func committedOffsets(ctx context.Context, adm *kadm.Client, group, topic string) (map[int32]int64, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		offsets, err := adm.FetchOffsets(kadm.RequireStable(ctx), group)
		if err == nil {
			at := map[int32]int64{}
			offsets.Each(func(o kadm.OffsetResponse) {
				if o.Topic == topic {
					if o.Err != nil {
						err = o.Err
					}
					at[o.Partition] = o.At
				}
			})
			if err == nil {
				return at, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("fetching %s's committed offsets: %w", group, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// reached reports whether at holds, for every partition of ends, at
// least its offset there.
func reached(at, ends map[int32]int64) bool {
	for p, end := range ends {
		if at[p] < end {
			return false
		}
	}
	return true
}

// rotated returns xs's indexes starting at round's: interleaved runs
// take the variants in another order each round, so that none always
// runs last.
func rotated(n, round int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = (round + i) % n
	}
	return out
}

// child is a counting child process of the bench: the bench's own binary
// (runChild) or the Kafka Streams peer.
type child struct {
	cmd    *exec.Cmd
	logs   *tail
	lines  *restoreLines
	exited chan struct{}
	err    error
}

func startChild(ctx context.Context, self string, env []string) (*child, error) {
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = env
	return startCmd(cmd)
}

// startCmd starts cmd as a child, its output kept and its restore lines
// collected.
func startCmd(cmd *exec.Cmd) (*child, error) {
	c := &child{cmd: cmd, logs: &tail{max: 64 << 10}, lines: &restoreLines{}, exited: make(chan struct{})}
	out := io.MultiWriter(c.logs, c.lines)
	c.cmd.Stdout, c.cmd.Stderr = out, out
	c.cmd.Cancel = func() error { return c.cmd.Process.Signal(syscall.SIGTERM) }
	c.cmd.WaitDelay = time.Minute
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a counter: %w", err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.exited) }()
	return c, nil
}

// kill SIGKILLs the child and waits for it to exit.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// stop SIGTERMs the child and waits for it to exit: an error unless it
// exited 0.
func (c *child) stop() error {
	select {
	case <-c.exited:
	default:
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		<-c.exited
	}
	if c.err != nil {
		return fmt.Errorf("the counter: %w:\n%s", c.err, c.logs.String())
	}
	return nil
}

// restored sums the records of the restores the child reported.
func (c *child) restored() int {
	n := 0
	for _, r := range c.lines.since(time.Time{}) {
		n += r.records
	}
	return n
}

// restoreLine is a restore a child reported: "restored partition=P
// records=R took_ms=T" (other fields between them ignored), and when the
// bench read it.
type restoreLine struct {
	at        time.Time
	partition int32
	records   int
	took      time.Duration
}

// restoreLines collects the restore lines written to it.
type restoreLines struct {
	mu    sync.Mutex
	part  []byte
	lines []restoreLine
}

func (l *restoreLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.part = append(l.part, p...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		if r, ok := parseRestoreLine(string(l.part[:i])); ok {
			r.at = time.Now()
			l.lines = append(l.lines, r)
		}
		l.part = l.part[i+1:]
	}
}

// since returns the restores reported at t or after.
func (l *restoreLines) since(t time.Time) []restoreLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []restoreLine
	for _, r := range l.lines {
		if !r.at.Before(t) {
			out = append(out, r)
		}
	}
	return out
}

func parseRestoreLine(line string) (restoreLine, bool) {
	fields, ok := strings.CutPrefix(line, "restored ")
	if !ok {
		return restoreLine{}, false
	}
	var r restoreLine
	seen := 0
	for _, f := range strings.Fields(fields) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "partition":
			n, err := strconv.ParseInt(v, 10, 32)
			r.partition, seen = int32(n), seen+btoi(err == nil)
		case "records":
			n, err := strconv.Atoi(v)
			r.records, seen = n, seen+btoi(err == nil)
		case "took_ms":
			ms, err := strconv.ParseFloat(v, 64)
			r.took, seen = time.Duration(ms*float64(time.Millisecond)), seen+btoi(err == nil)
		}
	}
	return r, seen == 3
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// counter is what a counting child runs (runChild): eos.Count of in in
// group, its state in changelog on memory or pebble (under dir) stores,
// under the transactional id txn (default group-0), with an InstanceID,
// an Endpoint and standbys if given. It travels in the child's
// environment.
type counter struct {
	brokers                               []string
	group, in, changelog, store, dir, txn string
	instance, endpoint                    string
	standbys                              int
}

// env is the child's environment: this process's, what it runs, and c.
func (c counter) env() []string {
	return append(os.Environ(), childEnv+"=count", "EOSKIT_BENCH_BROKERS="+strings.Join(c.brokers, ","),
		"EOSKIT_BENCH_GROUP="+c.group, "EOSKIT_BENCH_IN="+c.in, "EOSKIT_BENCH_CHANGELOG="+c.changelog,
		"EOSKIT_BENCH_STORE="+c.store, "EOSKIT_BENCH_DIR="+c.dir, "EOSKIT_BENCH_TXN="+cmp.Or(c.txn, c.group+"-0"),
		"EOSKIT_BENCH_INSTANCE="+c.instance, "EOSKIT_BENCH_ENDPOINT="+c.endpoint, "EOSKIT_BENCH_STANDBYS="+strconv.Itoa(c.standbys))
}

// counterFromEnv reads the counter env wrote.
func counterFromEnv() counter {
	standbys, _ := strconv.Atoi(os.Getenv("EOSKIT_BENCH_STANDBYS"))
	return counter{brokers: strings.Split(os.Getenv("EOSKIT_BENCH_BROKERS"), ","), group: os.Getenv("EOSKIT_BENCH_GROUP"),
		in: os.Getenv("EOSKIT_BENCH_IN"), changelog: os.Getenv("EOSKIT_BENCH_CHANGELOG"), store: os.Getenv("EOSKIT_BENCH_STORE"),
		dir: os.Getenv("EOSKIT_BENCH_DIR"), txn: os.Getenv("EOSKIT_BENCH_TXN"), instance: os.Getenv("EOSKIT_BENCH_INSTANCE"),
		endpoint: os.Getenv("EOSKIT_BENCH_ENDPOINT"), standbys: standbys}
}

// runChild runs what childEnv names (the bench's own binary started again
// by restartRun and rollingRun) and returns the process's exit code.
func runChild(what string) int {
	if what != "count" {
		fmt.Fprintf(os.Stderr, "bench child: unknown %s=%q\n", childEnv, what)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	c := counterFromEnv()
	stores := state.MemoryFactory()
	if c.store == "pebble" {
		stores = pebblestore.Factory(c.dir, nil)
	}
	stateOpts := []eos.StateOption{eos.CreateChangelog(), eos.Stores(stores)}
	if c.standbys > 0 {
		stateOpts = append(stateOpts, eos.Standbys(c.standbys))
	}
	opts := []eos.ProcessorOption{eos.Brokers(c.brokers...), eos.Group(c.group), eos.Topics(c.in), eos.TransactionalID(c.txn),
		eos.Logger(quiet), eos.WithMetrics(restorePrinter{eoskit.NopMetrics{}}), eos.Changelog(c.changelog, stateOpts...)}
	if c.instance != "" {
		opts = append(opts, eos.InstanceID(c.instance))
	}
	if c.endpoint != "" {
		opts = append(opts, eos.Endpoint(c.endpoint))
	}
	p, err := eos.NewProcessor(eos.Count(), opts...)
	if err == nil {
		err = p.Run(ctx)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		return 1
	}
	return 0
}

// restorePrinter prints each restore to stderr, for restartRun to read.
type restorePrinter struct{ eoskit.NopMetrics }

func (restorePrinter) Restored(_ string, partition int32, from int64, records int, took time.Duration) {
	fmt.Fprintf(os.Stderr, "restored partition=%d from=%d records=%d took_ms=%.1f\n", partition, from, records, float64(took)/float64(time.Millisecond))
}
