// Command eosbench measures the cost of eoskit's exactly-once processor
// against its baselines, side by side in one run on one broker, and prints a
// markdown table with each variant's throughput as a ratio to the
// at-least-once loop.
//
//	KAFKA_BROKERS=127.0.0.1:9092 go run ./internal/cmd/eosbench [-records 300000] [-sizes 100,1024] [-runs 3] [-only 100ms]
//
// Every variant copies the same number of pre-seeded records of the same size
// from a fresh input topic to a fresh output topic with the same handler. A
// run's time is from the processor's start until a read_committed reader has
// seen every output, so it includes joining the group and the last commit.
// Each table gives the median of the runs, and starts with the physical
// reference: the rate at which an idempotent producer writes, and a plain
// consumer reads, the same records on this broker.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/benchkit"
)

// maxPerCommit is high enough that the commit interval, not the record
// count, decides when each variant commits.
const maxPerCommit = 1_000_000

type variant struct {
	name string
	run  func(ctx context.Context, env *benchEnv) error // runs until ctx ends
}

type benchEnv struct {
	brokers []string
	in, out string
	group   string
}

func main() {
	records := flag.Int("records", 300_000, "records per run")
	sizesFlag := flag.String("sizes", "100,1024", "record value sizes in bytes, one table each")
	runs := flag.Int("runs", 3, "runs per variant (the median is reported)")
	partitions := flag.Int("partitions", 6, "input and output partitions")
	only := flag.String("only", "", "run only the variants whose name contains this (the at-least-once baseline always runs)")
	flag.Parse()
	brokers, _ := benchkit.Services("eosbench", false)

	copyTo := func(out string) eos.HandlerFunc {
		return func(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
			// The input's timestamp travels with the copy, so that a
			// reader can measure end-to-end latency.
			return []*kgo.Record{{Topic: out, Key: in.Key, Value: in.Value, Timestamp: in.Timestamp}}, nil
		}
	}
	processor := func(sem eos.Semantics, interval time.Duration) func(context.Context, *benchEnv) error {
		return func(ctx context.Context, env *benchEnv) error {
			opts := []eos.Option{eos.Brokers(env.brokers...), eos.Group(env.group), eos.InputTopics(env.in),
				eos.WithSemantics(sem), eos.CommitInterval(interval), eos.MaxRecordsPerCommit(maxPerCommit)}
			if sem == eos.ExactlyOnce {
				opts = append(opts, eos.TransactionalID(env.group+"-0"))
			}
			p, err := eos.NewProcessor(copyTo(env.out), opts...)
			if err != nil {
				return err
			}
			return p.Run(ctx)
		}
	}
	variants := []variant{
		{"at-least-once loop, 100ms", processor(eos.AtLeastOnce, 100*time.Millisecond)},
		{"raw GroupTransactSession, 100ms", rawSession(100 * time.Millisecond)},
		{"eos.Processor, 10ms", processor(eos.ExactlyOnce, 10*time.Millisecond)},
		{"eos.Processor, 100ms", processor(eos.ExactlyOnce, 100*time.Millisecond)},
		{"eos.Processor, 1s", processor(eos.ExactlyOnce, time.Second)},
	}

	variants = slices.DeleteFunc(variants, func(v variant) bool {
		return v.name != variants[0].name && v.name != variants[1].name && !strings.Contains(v.name, *only)
	})

	adm, admCl := admin(brokers)
	defer admCl.Close()
	for _, sz := range strings.Split(*sizesFlag, ",") {
		size, err := strconv.Atoi(sz)
		if err != nil {
			benchkit.Fail("eosbench", err)
		}
		report(adm, brokers, variants, *records, size, *runs, *partitions)
	}
}

// The physical reference: how fast this broker takes and gives records at
// all, measured on the same seeding and topics as the variants.
const (
	physProducer = "physical: idempotent producer"
	physConsumer = "physical: consumer"
)

func report(adm *kadm.Client, brokers []string, variants []variant, records, size, runs, partitions int) {
	results := map[string][]float64{}
	heap := map[string][]uint64{}
	fmt.Fprintf(os.Stderr, "eosbench: %d records of %d B, %d partitions, %d runs per variant, GOMAXPROCS=%d\n",
		records, size, partitions, runs, runtime.GOMAXPROCS(0))
	for r := range runs {
		// Variants take turns within each round, so that drift in the
		// machine's load spreads over all of them.
		for i, v := range variants {
			env := &benchEnv{brokers: brokers, group: fmt.Sprintf("eosbench-%d-%d-%d", time.Now().UnixNano(), r, i)}
			env.in, env.out = env.group+"-in", env.group+"-out"
			for _, t := range []string{env.in, env.out} {
				if _, err := adm.CreateTopic(context.Background(), int32(partitions), 1, nil, t); err != nil {
					benchkit.Fail("eosbench", err)
				}
			}
			start := time.Now()
			if err := seed(brokers, env.in, records, size); err != nil {
				benchkit.Fail("eosbench", err)
			}
			results[physProducer] = append(results[physProducer], float64(records)/time.Since(start).Seconds())
			if i == 0 {
				d, err := consumeAll(brokers, env.in, records)
				if err != nil {
					benchkit.Fail("eosbench", err)
				}
				results[physConsumer] = append(results[physConsumer], float64(records)/d.Seconds())
			}
			d, peak, err := timeRun(v, env, records)
			if err != nil {
				benchkit.Fail("eosbench", fmt.Errorf("%s: %w", v.name, err))
			}
			rate := float64(records) / d.Seconds()
			results[v.name] = append(results[v.name], rate)
			heap[v.name] = append(heap[v.name], peak)
			fmt.Fprintf(os.Stderr, "  run %d  %-34s %10.0f records/s  (%s)\n", r+1, v.name, rate, d.Round(time.Millisecond))
			_, _ = adm.DeleteTopics(context.Background(), env.in, env.out)
		}
	}

	latency := map[string][2]time.Duration{}
	for i, v := range variants {
		env := &benchEnv{brokers: brokers, group: fmt.Sprintf("eosbench-lat-%d-%d", time.Now().UnixNano(), i)}
		env.in, env.out = env.group+"-in", env.group+"-out"
		for _, t := range []string{env.in, env.out} {
			if _, err := adm.CreateTopic(context.Background(), int32(partitions), 1, nil, t); err != nil {
				benchkit.Fail("eosbench", err)
			}
		}
		p50, p99, err := latencyRun(v, env, size)
		if err != nil {
			benchkit.Fail("eosbench", fmt.Errorf("%s latency: %w", v.name, err))
		}
		latency[v.name] = [2]time.Duration{p50, p99}
		fmt.Fprintf(os.Stderr, "  latency  %-34s p50 %s  p99 %s\n", v.name, p50, p99)
		_, _ = adm.DeleteTopics(context.Background(), env.in, env.out)
	}

	base := benchkit.Median(results[variants[0].name])
	raw := benchkit.Median(results[variants[1].name])
	baseLat := latency[variants[0].name]
	fmt.Printf("\n| variant (%d × %d B records) | records/s (median) | vs at-least-once | vs raw session | p50 latency | p99 latency | p99 vs at-least-once | peak heap MiB |\n", records, size)
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, name := range []string{physProducer, physConsumer} {
		m := benchkit.Median(results[name])
		fmt.Printf("| %s | %.0f | %.2fx | %.2fx | - | - | - | - |\n", name, m, m/base, m/raw)
	}
	for _, v := range variants {
		m := benchkit.Median(results[v.name])
		l := latency[v.name]
		fmt.Printf("| %s | %.0f | %.2fx | %.2fx | %s | %s | %.2fx | %.1f |\n", v.name, m, m/base, m/raw,
			l[0].Round(100*time.Microsecond), l[1].Round(100*time.Microsecond), float64(l[1])/float64(baseLat[1]), float64(slices.Max(heap[v.name]))/(1<<20))
	}
}

// latencyRun starts v, then produces records at a steady 2,000 per second
// for 5 seconds while a read_committed reader measures, for each output,
// the time since its input was produced. It returns the median and the
// 99th percentile.
func latencyRun(v variant, env *benchEnv, size int) (p50, p99 time.Duration, err error) {
	const rate, seconds = 2000, 5
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- v.run(ctx, env) }()
	reader, err := kgo.NewClient(kgo.SeedBrokers(env.brokers...), kgo.ConsumeTopics(env.out),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, 0, err
	}
	defer reader.Close()
	prod, err := kgo.NewClient(kgo.SeedBrokers(env.brokers...), kgo.DefaultProduceTopic(env.in))
	if err != nil {
		return 0, 0, err
	}
	defer prod.Close()
	time.Sleep(2 * time.Second) // let the group form before the clock starts
	value := make([]byte, size)
	_, _ = rand.Read(value)
	go func() {
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for i := 0; i < rate*seconds; i++ {
			<-tick.C
			prod.Produce(ctx, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: value, Timestamp: time.Now()}, nil)
		}
	}()
	var lat []time.Duration
	deadline := time.Now().Add(time.Minute)
	for len(lat) < rate*seconds {
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("only %d of %d outputs within a minute", len(lat), rate*seconds)
		}
		pollCtx, pollCancel := context.WithTimeout(ctx, time.Second)
		f := reader.PollFetches(pollCtx)
		pollCancel()
		now := time.Now()
		f.EachRecord(func(r *kgo.Record) { lat = append(lat, now.Sub(r.Timestamp)) })
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return 0, 0, err
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], nil
}

// consumeAll reads n records from the start of topic with a plain consumer
// and returns how long it took.
func consumeAll(brokers []string, topic string, n int) (time.Duration, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	for seen := 0; seen < n; {
		f := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("consumed %d of %d: %w", seen, n, err)
		}
		seen += f.NumRecords()
	}
	return time.Since(start), nil
}

func admin(brokers []string) (*kadm.Client, *kgo.Client) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		benchkit.Fail("eosbench", err)
	}
	return kadm.NewClient(cl), cl
}

func seed(brokers []string, topic string, n, size int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	// Random values: franz-go compresses batches (snappy by default), and
	// a repeated byte would compress to almost nothing and flatter every
	// variant.
	values := make([][]byte, 4096)
	for i := range values {
		values[i] = make([]byte, size)
		_, _ = rand.Read(values[i])
	}
	var firstErr atomic.Value
	for i := range n {
		cl.Produce(context.Background(), &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: values[i%len(values)]}, func(_ *kgo.Record, err error) {
			if err != nil {
				firstErr.CompareAndSwap(nil, err)
			}
		})
	}
	if err := cl.Flush(context.Background()); err != nil {
		return err
	}
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return nil
}

// timeRun starts v and returns how long until a read_committed reader saw n
// outputs, and the peak heap in use sampled meanwhile.
func timeRun(v variant, env *benchEnv, n int) (time.Duration, uint64, error) {
	reader, err := kgo.NewClient(kgo.SeedBrokers(env.brokers...), kgo.ConsumeTopics(env.out),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, 0, err
	}
	defer reader.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runtime.GC()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- v.run(ctx, env) }()

	var peak atomic.Uint64
	stopSampling := make(chan struct{})
	defer close(stopSampling)
	go func() {
		var ms runtime.MemStats
		for {
			select {
			case <-stopSampling:
				return
			case <-time.After(100 * time.Millisecond):
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			}
		}
	}()

	seen := 0
	deadline := time.After(5 * time.Minute)
	for seen < n {
		select {
		case err := <-done:
			return 0, 0, fmt.Errorf("stopped early: %v", err)
		case <-deadline:
			return 0, 0, fmt.Errorf("only %d of %d outputs after 5 minutes", seen, n)
		default:
		}
		pollCtx, pollCancel := context.WithTimeout(ctx, time.Second)
		seen += reader.PollFetches(pollCtx).NumRecords()
		pollCancel()
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return 0, 0, err
	}
	return elapsed, peak.Load(), nil
}

// rawSession is the same copy loop written directly on franz-go's
// GroupTransactSession, as its documentation shows it, with the produce
// error check that correctness needs: the reference for what eoskit adds.
func rawSession(interval time.Duration) func(context.Context, *benchEnv) error {
	return func(ctx context.Context, env *benchEnv) error {
		sess, err := kgo.NewGroupTransactSession(
			kgo.SeedBrokers(env.brokers...),
			kgo.TransactionalID(env.group+"-0"),
			kgo.ConsumerGroup(env.group),
			kgo.ConsumeTopics(env.in),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		)
		if err != nil {
			return err
		}
		defer sess.Close()
		for {
			fetches := sess.PollRecords(ctx, maxPerCommit)
			if ctx.Err() != nil {
				return nil
			}
			if fetches.NumRecords() == 0 {
				continue
			}
			if err := sess.Begin(); err != nil {
				return err
			}
			var failed atomic.Bool
			start, n := time.Now(), 0
			for {
				n += fetches.NumRecords()
				fetches.EachRecord(func(r *kgo.Record) {
					sess.Produce(ctx, &kgo.Record{Topic: env.out, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}, func(_ *kgo.Record, err error) {
						if err != nil {
							failed.Store(true)
						}
					})
				})
				left := time.Until(start.Add(interval))
				if left <= 0 || n >= maxPerCommit {
					break
				}
				pollCtx, cancel := context.WithTimeout(ctx, left)
				fetches = sess.PollRecords(pollCtx, maxPerCommit-n)
				cancel()
				if ctx.Err() != nil {
					break
				}
			}
			if err := sess.Client().Flush(context.WithoutCancel(ctx)); err != nil {
				return err
			}
			if _, err := sess.End(context.WithoutCancel(ctx), kgo.TransactionEndTry(!failed.Load() && ctx.Err() == nil)); err != nil {
				return err
			}
		}
	}
}
