package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/metrics"
	"slices"
	"time"

	"github.com/eoskit/eoskit/eos"
)

// The memory table: the peak heap (in use, sampled every 10 ms) of eos.Processor (ExactlyOnce, 100 ms,
// the CPU-bound table's settings) while it copies each of counts records
// of 100 B, from one backlog of the largest count over 6 partitions (each
// run with a fresh group and output topic, until the group has committed
// that many). The goal: flat, the largest count within 10% of the
// smallest.
const (
	memSize       = 100
	memPartitions = 6
	memGoal       = 1.10
)

func (b *bench) memory(ctx context.Context, w io.Writer, counts []int) error {
	topic := fmt.Sprintf("bench-memory-%d-in", time.Now().UnixNano())
	if err := b.createTopics(ctx, memPartitions, topic); err != nil {
		return err
	}
	defer onFail(func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), topic) })()
	fmt.Fprintf(os.Stderr, "memory: seeding %d records of %d B\n", slices.Max(counts), memSize)
	if err := seed(ctx, b.brokers, topic, slices.Max(counts), memSize, 0, false); err != nil {
		return err
	}
	peaks := make([][]uint64, len(counts))
	for r := range b.runs {
		for i, n := range counts {
			peak, d, err := b.memoryRun(ctx, topic, n, fmt.Sprintf("%d-%d", r, i), processor(eos.ExactlyOnce, 100*time.Millisecond))
			if err != nil {
				return fmt.Errorf("%d records: %w", n, err)
			}
			peaks[i] = append(peaks[i], peak)
			fmt.Fprintf(os.Stderr, "  run %d  %10d records  peak heap %.1f MiB  (%s)\n", r+1, n, mib(peak), d.Round(time.Millisecond))
		}
	}
	fmt.Fprintf(w, "\nMemory: eos.Processor (ExactlyOnce, 100ms) copying records of %d B over %d partitions; peak heap in use of the benchmark process (runtime/metrics, sampled every 10 ms); median of %d runs (min-max)\n\n",
		memSize, memPartitions, b.runs)
	fmt.Fprintf(w, "| records copied | peak heap MiB | min-max | vs %d records | goal (≤ %.2fx) |\n", counts[0], memGoal)
	fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | --- |")
	base := medianU(peaks[0])
	for i, n := range counts {
		med := medianU(peaks[i])
		ratio := float64(med) / float64(base)
		goal := "-"
		if i > 0 {
			goal = metOrMissed(ratio <= memGoal)
		}
		fmt.Fprintf(w, "| %d | %.1f | %.1f-%.1f | %.2fx | %s |\n", n, mib(med), mib(slices.Min(peaks[i])), mib(slices.Max(peaks[i])), ratio, goal)
	}
	return nil
}

// memoryRun runs proc over n records of topic with a fresh group and
// output topic, and returns the peak heap meanwhile and how long it took.
func (b *bench) memoryRun(ctx context.Context, topic string, n int, suffix string, proc func(context.Context, *env) (running, error)) (uint64, time.Duration, error) {
	group := fmt.Sprintf("bench-memory-%d-%s", time.Now().UnixNano(), suffix)
	e := &env{brokers: b.brokers, in: topic, out: group + "-out", group: group}
	if err := b.createTopics(ctx, memPartitions, e.out); err != nil {
		return 0, 0, err
	}
	defer onFail(func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), e.out) })()
	start := func(ctx context.Context, e *env) (running, error) {
		run, err := proc(ctx, e)
		run.progress, run.failed = groupProgress(b.adm, group, topic)
		return run, err
	}
	elapsed, peak, err := throughputRun(ctx, variant{name: "memory", start: start}, e, n, 10*time.Millisecond, 10*time.Minute)
	return peak, elapsed, err
}

// heapInUse is runtime.MemStats.HeapInuse (the heap's spans in use:
// objects and the free space within their spans), read through
// runtime/metrics, which does not stop the world.
func heapInUse() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/unused:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() + s[1].Value.Uint64()
}

// sampleHeap samples heapInUse every period until the returned func is
// called, which returns the peak (sampling once more, so that a run
// shorter than the period still gets a sample).
func sampleHeap(period time.Duration) func() uint64 {
	peak := heapInUse()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				peak = max(peak, heapInUse())
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		return max(peak, heapInUse())
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func medianU(xs []uint64) uint64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func metOrMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}
