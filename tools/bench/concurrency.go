package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/offsetstore"
)

// The I/O-bound table: a handler that waits 5 ms per record (a call to
// another service), over 12 partitions and 10,000 keys, at concurrency
// bounds from 1 up. Each variant runs on a fresh topic holding more
// records than it can copy in the window; its rate is what it committed
// during a 10 s window after a 2 s warm-up (so every variant measures 10 s
// of work, whatever its speed). The goal is at least 0.8 x bound / 5 ms.
const (
	ioDelay      = 5 * time.Millisecond
	ioPartitions = 12
	ioKeys       = 10_000
	ioWarmup     = 2 * time.Second
	ioWindow     = 10 * time.Second
)

type ioVariant struct {
	path, name string
	bound      int // the concurrency bound
	start      func(ctx context.Context, e *env) (running, error)
}

func ioVariants() []ioVariant {
	// A poll takes records partition by partition (franz-go): with a
	// backlog, one partition's records fill it unless each fetch holds
	// few records per partition. The variants across partitions cap it.
	spread := kgo.FetchMaxPartitionBytes(8 << 10)
	eosAt := func(n int, order eos.Order, opts ...kgo.Opt) func(context.Context, *env) (running, error) {
		return func(ctx context.Context, e *env) (running, error) {
			p, err := eos.NewProcessor(func(ctx context.Context, in *kgo.Record) ([]*kgo.Record, error) {
				time.Sleep(ioDelay)
				return copyTo(e.out)(ctx, in)
			}, eos.Brokers(e.brokers...), eos.Group(e.group), eos.Topics(e.in), eos.TransactionalID(e.group+"-0"),
				eos.Concurrency(n, order), eos.Logger(quiet), eos.ClientOptions(opts...))
			if err != nil {
				return running{}, err
			}
			return running{progress: countCommitted(ctx, e), wait: background(func() error { return p.Run(ctx) })}, nil
		}
	}
	sleepy := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		time.Sleep(time.Duration(len(recs)) * ioDelay)
		return copyRows(ctx, tx, recs)
	}
	offsetstoreAt := func(n int) func(context.Context, *env) (running, error) {
		return func(ctx context.Context, e *env) (running, error) {
			r, err := offsetstore.NewRunner(poolFor(e, n), sleepy, offsetstore.Brokers(e.brokers...), offsetstore.Group(e.group),
				offsetstore.Topics(e.in), offsetstore.MaxRecordsPerCommit(1000), offsetstore.Concurrency(n), offsetstore.Logger(quiet),
				offsetstore.ClientOptions(spread))
			if err != nil {
				return running{}, err
			}
			return running{progress: func() int64 { return r.Stats().Records }, wait: background(func() error { return r.Run(ctx) })}, nil
		}
	}
	store, err := dedup.NewPostgresStore(idsTable)
	if err != nil {
		fail(err)
	}
	dedupAt := func(n int) func(context.Context, *env) (running, error) {
		return func(ctx context.Context, e *env) (running, error) {
			c, err := dedup.NewConsumer(poolFor(e, n), store, func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
				time.Sleep(ioDelay)
				return insertRow(ctx, tx, r)
			}, dedup.Brokers(e.brokers...), dedup.Group(e.group), dedup.Topics(e.in), dedup.MaxRecordsPerCommit(1000), dedup.Concurrency(n),
				dedup.ID(func(r *kgo.Record) (string, bool) { return fmt.Sprintf("%d/%d", r.Partition, r.Offset), true }),
				dedup.Logger(quiet), dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), spread))
			if err != nil {
				return running{}, err
			}
			return running{progress: func() int64 { return c.Stats().Applied }, wait: background(func() error { return c.Run(ctx) })}, nil
		}
	}
	return []ioVariant{
		{"eos", "Concurrency 1", 1, eosAt(1, eos.PartitionOrder)},
		{"eos", "Concurrency 4, KeyOrder", 4, eosAt(4, eos.KeyOrder)},
		{"eos", "Concurrency 16, KeyOrder", 16, eosAt(16, eos.KeyOrder)},
		{"eos", "Concurrency 12, PartitionOrder", 12, eosAt(12, eos.PartitionOrder)},
		{"eos", "Concurrency 12, PartitionOrder, 8 KiB fetches", 12, eosAt(12, eos.PartitionOrder, spread)},
		{"offsetstore", "Concurrency 1", 1, offsetstoreAt(1)},
		{"offsetstore", "Concurrency 4", 4, offsetstoreAt(4)},
		{"offsetstore", "Concurrency 12", 12, offsetstoreAt(12)},
		{"dedup", "Concurrency 1", 1, dedupAt(1)},
		{"dedup", "Concurrency 4", 4, dedupAt(4)},
		{"dedup", "Concurrency 12", 12, dedupAt(12)},
	}
}

// ioPicker selects the I/O-bound variants of path (every path if empty)
// whose name matches the regular expression name; it fails if none does.
func ioPicker(path, name string) (func(ioVariant) bool, error) {
	re, err := regexp.Compile(name)
	if err != nil {
		return nil, fmt.Errorf("-io-variant: %w", err)
	}
	pick := func(v ioVariant) bool { return (path == "" || v.path == path) && re.MatchString(v.name) }
	if !slices.ContainsFunc(ioVariants(), pick) {
		return nil, fmt.Errorf("-io-path %q -io-variant %q: no I/O-bound variant matches", path, name)
	}
	return pick, nil
}

// poolFor gives a database runner as many connections as its bound needs.
func poolFor(e *env, n int) *pgxpool.Pool {
	cfg := e.pool.Config()
	cfg.MaxConns = int32(max(4, n+2))
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		fail(err)
	}
	e.closers = append(e.closers, pool.Close)
	return pool
}

// ioBound measures every variant runs times, interleaved, in two regimes,
// and prints the table: the median rate, its spread, and the ratio to the
// goal. backlog: the topic holds more than the variant can copy in the
// run. live: a producer writes at the goal's rate while it runs (polls
// then hold a few records of many partitions).
func (b *bench) ioBound(ctx context.Context, w io.Writer, pick func(ioVariant) bool) error {
	variants := ioVariants()
	type key struct {
		regime string
		i      int
	}
	rates := map[key][]float64{}
	regimes := []string{"backlog", "live"}
	for r := range b.runs {
		for _, regime := range regimes {
			for i, v := range variants {
				if !pick(v) {
					continue
				}
				p := path{name: "io-" + v.path, partitions: ioPartitions, output: v.path == "eos"}
				e, err := b.newEnv(ctx, p, fmt.Sprintf("%s-%d-%d", regime, r, i))
				if err != nil {
					return err
				}
				goal := 0.8 * float64(v.bound) / ioDelay.Seconds()
				var live func() error
				liveCtx, stopLive := context.WithCancel(ctx)
				if regime == "backlog" {
					// More than the bound could copy in warm-up and
					// window at the goal's rate.
					if err := seedKeys(ctx, b.brokers, e.in, int(goal*(ioWarmup+ioWindow).Seconds()*1.5), 100, ioKeys); err != nil {
						stopLive()
						return err
					}
				} else {
					live = produceSteadily(liveCtx, b.brokers, e.in, goal)
				}
				rate, err := windowRate(ctx, v.start, e)
				stopLive()
				if live != nil {
					if lerr := live(); err == nil {
						err = lerr
					}
				}
				b.dropEnv(ctx, e)
				if err != nil {
					return fmt.Errorf("%s %s (%s): %w", v.path, v.name, regime, err)
				}
				rates[key{regime, i}] = append(rates[key{regime, i}], rate)
				fmt.Fprintf(os.Stderr, "  io %s run %d  %-12s %-40s %8.0f records/s\n", regime, r+1, v.path, v.name, rate)
			}
		}
	}
	fmt.Fprintf(w, "\nI/O-bound handler (%s per record), %d partitions, %d keys; committed during a %s window after %s warm-up; median of %d runs (min-max). backlog: the topic holds more than the run can copy; live: records arrive at the goal's rate meanwhile (a rate at the goal means it kept up)\n\n",
		ioDelay, ioPartitions, ioKeys, ioWindow, ioWarmup, b.runs)
	fmt.Fprintln(w, "| path | variant | regime | records/s | min-max | goal (0.8 x bound / 5 ms) | ratio to goal | vs Concurrency 1 |")
	fmt.Fprintln(w, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
	for _, regime := range regimes {
		base := map[string]float64{}
		for i, v := range variants {
			rs := rates[key{regime, i}]
			if len(rs) == 0 {
				continue
			}
			med := median(rs)
			if v.bound == 1 {
				base[v.path] = med
			}
			goal := 0.8 * float64(v.bound) / ioDelay.Seconds()
			vsOne := "-" // Concurrency 1 not run (-io-variant)
			if base[v.path] > 0 {
				vsOne = fmt.Sprintf("%.1fx", med/base[v.path])
			}
			fmt.Fprintf(w, "| %s | %s | %s | %.0f | %.0f-%.0f | %.0f | %.2fx | %s |\n", v.path, v.name, regime, med, slices.Min(rs), slices.Max(rs), goal, med/goal, vsOne)
		}
	}
	return b.ioLatency(ctx, w, variants, pick)
}

// ioLatencyGoal is the p99 goal at half load: the commit interval (eos's
// default 100 ms; the database paths commit per poll) plus the handler's
// 5 ms plus 20 ms.
const ioLatencyGoal = 100*time.Millisecond + ioDelay + 20*time.Millisecond

// ioLatency runs each variant once with records produced at half its
// throughput goal for 10 s, each stamped with its produce time, and prints
// the p50 and p99 delays until each result was visible (read_committed
// output, or a committed row) against ioLatencyGoal.
func (b *bench) ioLatency(ctx context.Context, w io.Writer, variants []ioVariant, pick func(ioVariant) bool) error {
	type result struct {
		v        ioVariant
		rate     int
		p50, p99 time.Duration
	}
	var results []result
	for i, v := range variants {
		if !pick(v) {
			continue
		}
		rate := int(0.8 * float64(v.bound) / ioDelay.Seconds() / 2)
		p := path{name: "io-" + v.path, partitions: ioPartitions, output: v.path == "eos"}
		e, err := b.newEnv(ctx, p, fmt.Sprintf("latency-%d", i))
		if err != nil {
			return err
		}
		lat, err := latencyRun(ctx, variant{name: v.name, start: v.start}, e, p, 100, rate, 10)
		b.dropEnv(ctx, e)
		if err != nil {
			return fmt.Errorf("%s %s (latency at half load): %w", v.path, v.name, err)
		}
		r := result{v: v, rate: rate, p50: lat[len(lat)/2], p99: lat[len(lat)*99/100]}
		fmt.Fprintf(os.Stderr, "  io latency  %-12s %-40s %5d/s  p50 %s  p99 %s\n", v.path, v.name, rate, r.p50, r.p99)
		results = append(results, r)
	}
	fmt.Fprintf(w, "\nThe same handler at half the throughput goal, records produced at a steady rate for 10 s: delay from produce until the result is visible (read_committed output, or a committed row); goal p99 <= %s (commit interval 100 ms + handler 5 ms + 20 ms)\n\n", ioLatencyGoal)
	fmt.Fprintln(w, "| path | variant | records/s | p50 | p99 | p99 goal |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | --- |")
	for _, r := range results {
		verdict := "met"
		if r.p99 > ioLatencyGoal {
			verdict = "missed"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s |\n", r.v.path, r.v.name, r.rate, r.p50.Round(100*time.Microsecond), r.p99.Round(100*time.Microsecond), verdict)
	}
	return nil
}

// produceSteadily writes records to topic at rate per second, in the
// background, until ctx ends; the returned func waits for it and returns
// its error.
func produceSteadily(ctx context.Context, brokers []string, topic string, rate float64) func() error {
	done := make(chan error, 1)
	go func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(time.Millisecond))
		if err != nil {
			done <- err
			return
		}
		defer cl.Close()
		values := randomValues(64, 100)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		start, sent := time.Now(), 0
		for now := range tick.C {
			if ctx.Err() != nil {
				break
			}
			due := int(rate * now.Sub(start).Seconds())
			for ; sent < due; sent++ {
				cl.Produce(ctx, &kgo.Record{Key: fmt.Appendf(nil, "k%d", sent%ioKeys), Value: values[sent%len(values)]}, nil)
			}
		}
		done <- nil
	}()
	return func() error { return <-done }
}

// windowRate starts a variant and returns what it committed per second in
// the window after the warm-up.
func windowRate(ctx context.Context, start func(context.Context, *env) (running, error), e *env) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	run, err := start(ctx, e)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(time.Minute)
	for run.progress() == 0 {
		if time.Now().After(deadline) {
			cancel()
			return 0, fmt.Errorf("nothing committed after a minute (consumer: %v)", run.wait())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(ioWarmup)
	from := run.progress()
	time.Sleep(ioWindow)
	got := run.progress() - from
	cancel()
	if err := run.wait(); err != nil {
		return 0, err
	}
	return float64(got) / ioWindow.Seconds(), nil
}

// seedKeys writes n records of size bytes over keys distinct keys.
func seedKeys(ctx context.Context, brokers []string, topic string, n, size, keys int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	values := randomValues(64, size)
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Key: fmt.Appendf(nil, "k%d", i%keys), Value: values[i%len(values)]}
	}
	return cl.ProduceSync(ctx, recs...).FirstErr()
}
