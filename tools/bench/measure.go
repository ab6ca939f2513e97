package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/outbox"
)

type bench struct {
	brokers []string
	pool    *pgxpool.Pool
	adm     *kadm.Client
	runs    int
	// The windowed tables' window and warm-up, and where to write a CPU
	// profile of each window (empty: nowhere).
	window, warmup time.Duration
	cpuProfiles    string
}

// env is one run's fresh input topic, and output topic on the eos path.
type env struct {
	brokers []string
	pool    *pgxpool.Pool
	in, out string
	group   string
	slot    string   // the outbox path's replication slot
	values  [][]byte // what seedInput wrote, for a variant that needs it
	closers []func() // run by dropEnv
	undo    func()   // runs dropEnv, unless the bench fails first
}

// running is a consumer under test, started on env.in: progress counts
// the records whose results are visible (read_committed output, or
// committed rows), and wait returns what it returned once ctx ended.
type running struct {
	progress func() int64
	failed   func() error // optional: why progress can no longer be read
	wait     func() error
	probe    *probe // optional: sees its transactions and requests
	// cpu, when set, is the CPU time of the process doing the work (a
	// peer running as a process of its own), which the windowed tables
	// then count instead of the benchmark process's.
	cpu func() time.Duration
}

type variant struct {
	name  string
	start func(ctx context.Context, e *env) (running, error)
	// throughputOnly: no latency run (a reference that has no input to
	// time from).
	throughputOnly bool
	// clean, when set, names the variant of the same path that does the
	// same work on clean input: the report gives the ratio to it too.
	clean string
}

// path is one of eoskit's exactly-once paths with its baselines.
type path struct {
	name       string
	records    int
	partitions int
	output     bool      // it writes to an output topic (else to the results table)
	stamp      bool      // inputs carry dedup's id header
	slot       bool      // each env gets its own outbox replication slot
	variants   []variant // variants[0] is the at-least-once baseline
	// seedInput, when set, writes a run's input instead of seeding the
	// input topic, and latencyInput writes the latency run's n records
	// at rate per second instead of produceTimed.
	seedInput    func(ctx context.Context, e *env, n, size int) error
	latencyInput func(ctx context.Context, e *env, n, rate int, value []byte) error
}

// row is one line of the report.
type row struct {
	path, variant string
	clean         string // the variant's clean counterpart, if any
	size, records int
	rates         []float64
	heap          uint64        // peak bytes in use; 0 when not measured
	p50, p99      time.Duration // 0 when not measured
}

func (b *bench) measure(ctx context.Context, p path, size int) ([]row, error) {
	fmt.Fprintf(os.Stderr, "%s: %d records of %d B, %d partitions\n", p.name, p.records, size, p.partitions)
	rows := make([]row, len(p.variants))
	for i, v := range p.variants {
		rows[i] = row{path: p.name, variant: v.name, clean: v.clean, size: size, records: p.records}
	}
	for r := range b.runs {
		// Variants take turns within each round, so that drift in the
		// machine's load spreads over all of them.
		for i, v := range p.variants {
			e, err := b.newEnv(ctx, p, fmt.Sprintf("%d-%d", r, i))
			if err != nil {
				return nil, err
			}
			if p.seedInput != nil {
				if err := p.seedInput(ctx, e, p.records, size); err != nil {
					return nil, err
				}
			} else if err := seed(ctx, b.brokers, e.in, p.records, size, 0, p.stamp); err != nil {
				return nil, err
			}
			d, peak, err := throughputRun(ctx, v, e, p.records, 100*time.Millisecond, 5*time.Minute)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			rate := float64(p.records) / d.Seconds()
			rows[i].rates = append(rows[i].rates, rate)
			rows[i].heap = max(rows[i].heap, peak)
			fmt.Fprintf(os.Stderr, "  run %d  %-40s %10.0f records/s  (%s)\n", r+1, v.name, rate, d.Round(time.Millisecond))
			b.dropEnv(ctx, e)
		}
	}
	for i, v := range p.variants {
		if v.throughputOnly {
			continue
		}
		e, err := b.newEnv(ctx, p, fmt.Sprintf("lat-%d", i))
		if err != nil {
			return nil, err
		}
		lat, err := latencyRun(ctx, v, e, p, size, 2000, 5)
		if err != nil {
			return nil, fmt.Errorf("%s latency: %w", v.name, err)
		}
		rows[i].p50, rows[i].p99 = lat[len(lat)/2], lat[len(lat)*99/100]
		fmt.Fprintf(os.Stderr, "  latency  %-40s p50 %s  p99 %s\n", v.name, rows[i].p50, rows[i].p99)
		b.dropEnv(ctx, e)
	}
	return rows, nil
}

func (b *bench) newEnv(ctx context.Context, p path, suffix string) (*env, error) {
	e := &env{brokers: b.brokers, pool: b.pool, group: fmt.Sprintf("bench-%s-%d-%s", p.name, time.Now().UnixNano(), suffix)}
	e.in = e.group + "-in"
	topics := []string{e.in}
	if p.output {
		e.out = e.group + "-out"
		topics = append(topics, e.out)
	}
	if err := b.createTopics(ctx, p.partitions, topics...); err != nil {
		return nil, err
	}
	e.undo = onFail(func() { e.undo = nil; b.dropEnv(ctx, e) })
	if !p.output {
		if _, err := b.pool.Exec(ctx, `TRUNCATE `+rowsTable+`, `+idsTable); err != nil {
			return nil, err
		}
	}
	if p.slot {
		e.slot = fmt.Sprintf("bench_%d", time.Now().UnixNano())
		if err := outbox.CreateSlot(ctx, b.pool, e.slot); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func (b *bench) dropEnv(ctx context.Context, e *env) {
	if e.undo != nil {
		e.undo() // unregisters, and calls dropEnv again without it
		return
	}
	for _, c := range e.closers {
		c()
	}
	topics := []string{e.in}
	if e.out != "" {
		topics = append(topics, e.out)
	}
	_, _ = b.adm.DeleteTopics(ctx, topics...)
	if e.slot != "" {
		_ = outbox.DropSlot(ctx, b.pool, e.slot)
	}
}

// throughputRun starts v and returns how long until all n results were
// visible, and the peak heap in use meanwhile, sampled every period; it
// gives up after limit.
func throughputRun(ctx context.Context, v variant, e *env, n int, period, limit time.Duration) (time.Duration, uint64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runtime.GC()
	sampler := sampleHeap(period)
	start := time.Now()
	run, err := v.start(ctx, e)
	if err != nil {
		sampler()
		return 0, 0, err
	}
	for run.progress() < int64(n) {
		if run.failed != nil {
			if err := run.failed(); err != nil {
				sampler()
				cancel()
				return 0, 0, errors.Join(err, run.wait())
			}
		}
		if time.Since(start) > limit {
			sampler()
			cancel()
			return 0, 0, fmt.Errorf("only %d of %d results after %s (consumer: %v)", run.progress(), n, limit, run.wait())
		}
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(start)
	peak := sampler()
	cancel()
	if err := run.wait(); err != nil && !errors.Is(err, context.Canceled) {
		return 0, 0, err
	}
	return elapsed, peak, nil
}

// latencyRun starts v, lets its group form, then produces records at a
// steady rate per second for seconds, each stamped with its produce time,
// and returns the sorted delays until each result became visible.
func latencyRun(ctx context.Context, v variant, e *env, p path, size, rate, seconds int) ([]time.Duration, error) {
	n := rate * seconds
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	run, err := v.start(ctx, e)
	if err != nil {
		return nil, err
	}
	obs := newObserver(ctx, e, p.output)
	time.Sleep(3 * time.Second) // let the group form before the clock starts

	value := randomValues(1, size)[0]
	input := p.latencyInput
	if input == nil {
		input = produceTimed(p.stamp)
	}
	go func() {
		if err := input(ctx, e, n, rate, value); err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "  latency input: %v\n", err)
		}
	}()
	lat, err := obs.collect(n, time.Minute+time.Duration(seconds)*time.Second)
	cancel()
	if werr := run.wait(); werr != nil && !errors.Is(werr, context.Canceled) {
		return nil, werr
	}
	if err != nil {
		return nil, err
	}
	slices.Sort(lat)
	return lat, nil
}

// produceTimed produces n records to the env's input topic at rate per
// second, each stamped with its produce time.
func produceTimed(stamp bool) func(ctx context.Context, e *env, n, rate int, value []byte) error {
	return func(ctx context.Context, e *env, n, rate int, value []byte) error {
		prod, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.in))
		if err != nil {
			return err
		}
		defer prod.Close()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for i := range n {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			r := &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: value, Timestamp: time.Now()}
			if stamp {
				r = dedup.Stamp(r)
			}
			prod.Produce(ctx, r, nil)
		}
		return prod.Flush(ctx)
	}
}

// seed writes n records with random values of size bytes (franz-go
// compresses batches, and repeated bytes would flatter every variant),
// each with a key of its own, or with keys > 0 a key drawn at random from
// keys distinct ones (k0 ... k<keys-1>).
func seed(ctx context.Context, brokers []string, topic string, n, size, keys int, stamp bool) error {
	values := randomValues(4096, size)
	return produceEach(ctx, brokers, topic, n, func(i int) *kgo.Record {
		k := i
		if keys > 0 {
			k = mrand.IntN(keys)
		}
		r := &kgo.Record{Key: fmt.Appendf(nil, "k%d", k), Value: values[i%len(values)]}
		if stamp {
			r = dedup.Stamp(r)
		}
		return r
	})
}

// produceEach writes record(i) for i from 0 to n-1 to topic, without
// waiting for each, and returns the first failure once all are flushed.
func produceEach(ctx context.Context, brokers []string, topic string, n int, record func(i int) *kgo.Record) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	var firstErr atomic.Value
	for i := range n {
		cl.Produce(ctx, record(i), func(_ *kgo.Record, err error) {
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return nil
}

func randomValues(count, size int) [][]byte {
	vs := make([][]byte, count)
	for i := range vs {
		vs[i] = make([]byte, size)
		_, _ = rand.Read(vs[i])
	}
	return vs
}

// background runs fn until ctx ends and returns a wait for its result.
func background(fn func() error) func() error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	var err error
	var got bool
	return func() error {
		if !got {
			err, got = <-done, true
		}
		return err
	}
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
