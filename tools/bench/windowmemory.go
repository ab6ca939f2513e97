package main

import (
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/window"
)

// The windowed memory table (issue 45): the peak heap in use of
// eos.Processor counting by key in tumbling one-minute windows
// (eos.WindowedCount, grace 10 s, the in-memory store, eos's defaults)
// over each of counts records of 100 B, keys drawn from wmemKeys over 6
// partitions, whose record times advance by a millisecond a record: 10
// million records span 167 windows. With the windows' retention (size +
// grace, counted from a window's start) a key keeps at most two windows,
// so the heap must stay flat as the input grows (goal: the largest count
// within 1.10x the smallest, as the copy's memory table). A run at the
// largest count with windows kept 1,000 hours (none expires) holds every
// window of every key: its peak less the retained runs', over the
// windows it holds beyond theirs, is the heap a window of a key costs
// (garbage between collections included: each sweep copies every key).
const (
	wmemKeys = 10_000
	wmemStep = time.Millisecond // record time between consecutive records
)

var (
	wmemRetained = window.Tumbling(time.Minute, 10*time.Second)
	wmemKept     = window.Spec{Size: time.Minute, Advance: time.Minute, Grace: 10 * time.Second, Retention: 1000 * time.Hour}
)

func (b *bench) windowMemory(ctx context.Context, w io.Writer, counts []int) error {
	topic := fmt.Sprintf("bench-wmemory-%d-in", time.Now().UnixNano())
	if err := b.createTopics(ctx, memPartitions, topic); err != nil {
		return err
	}
	defer onFail(func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), topic) })()
	largest := slices.Max(counts)
	fmt.Fprintf(os.Stderr, "windowed memory: seeding %d records of %d B, %d keys, record times %s apart\n", largest, memSize, wmemKeys, wmemStep)
	pairs, err := seedWindowed(ctx, b.brokers, topic, largest, wmemKeys)
	if err != nil {
		return err
	}
	specs := []struct {
		name string
		spec window.Spec
	}{{"retention 70s (size + grace)", wmemRetained}, {"kept 1000h", wmemKept}}
	peaks := make([][][]uint64, len(specs)) // spec, count, run
	for s := range specs {
		peaks[s] = make([][]uint64, len(counts))
	}
	for r := range b.runs {
		for s, spec := range specs {
			for i, n := range counts {
				if spec.spec == wmemKept && n != largest {
					continue // the kept windows are measured at the largest count only
				}
				h, err := eos.WindowedCount(spec.spec)
				if err != nil {
					return err
				}
				peak, d, err := b.memoryRun(ctx, topic, n, fmt.Sprintf("w%d-%d-%d", r, s, i), countingWith(h))
				if err != nil {
					return fmt.Errorf("%s, %d records: %w", spec.name, n, err)
				}
				peaks[s][i] = append(peaks[s][i], peak)
				fmt.Fprintf(os.Stderr, "  run %d  %s  %10d records  peak heap %.1f MiB  (%s)\n", r+1, spec.name, n, mib(peak), d.Round(time.Millisecond))
			}
		}
	}
	fmt.Fprintf(w, "\nWindowed memory: eos.Processor counting by key in tumbling 1m windows (eos.WindowedCount, grace 10s, memory store, eos's defaults), records of %d B, %d keys, %d partitions, record times %s apart (%d records span %d windows); peak heap in use of the benchmark process (runtime/metrics, sampled every 10 ms); median of %d runs (min-max)\n\n",
		memSize, wmemKeys, memPartitions, wmemStep, largest, windowsSpanned(largest), b.runs)
	fmt.Fprintf(w, "| windows | records counted | windows of a key held at the end | peak heap MiB | min-max | vs %d records, same windows | goal (≤ %.2fx) |\n", counts[0], memGoal)
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | --- |")
	base := medianU(peaks[0][0])
	for i, n := range counts {
		med := medianU(peaks[0][i])
		ratio := float64(med) / float64(base)
		goal := "-"
		if i > 0 {
			goal = metOrMissed(ratio <= memGoal)
		}
		fmt.Fprintf(w, "| %s | %d | ≤ 2 | %.1f | %.1f-%.1f | %.2fx | %s |\n", specs[0].name, n, mib(med), mib(slices.Min(peaks[0][i])), mib(slices.Max(peaks[0][i])), ratio, goal)
	}
	li := slices.Index(counts, largest)
	kept, retained := medianU(peaks[1][li]), medianU(peaks[0][li])
	fmt.Fprintf(w, "| %s | %d | %d (all) | %.1f | %.1f-%.1f | - | - |\n", specs[1].name, largest, windowsSpanned(largest), mib(kept), mib(slices.Min(peaks[1][li])), mib(slices.Max(peaks[1][li])))
	// The retained runs hold at most 2 windows of each key: starts within
	// the last 70 s of stream time, a minute apart.
	extra := pairs - int64(2*wmemKeys)
	if kept > retained && extra > 0 {
		fmt.Fprintf(w, "\nA window of a key costs about %.0f B of heap: the kept runs' peak less the retained runs' (%.1f MiB), over the %d windows of keys they hold beyond the retained runs' at most %d (the input's %d distinct key and window pairs).\n",
			float64(kept-retained)/float64(extra), mib(kept-retained), extra, 2*wmemKeys, pairs)
	}
	return nil
}

// windowsSpanned is how many one-minute windows n records wmemStep apart
// reach.
func windowsSpanned(n int) int {
	return int((time.Duration(n-1)*wmemStep)/time.Minute) + 1
}

// seedWindowed writes n random records of memSize B to topic, keys drawn
// from keys, record i stamped wmemStep after record i-1 (the last an hour
// before now: a broker's log.message.timestamp.before.max.ms, unbounded by
// default, must allow the first), and returns how many
// distinct (key, one-minute window) pairs they make.
func seedWindowed(ctx context.Context, brokers []string, topic string, n, keys int) (int64, error) {
	values := randomValues(4096, memSize)
	first := time.Now().Add(-time.Hour - time.Duration(n)*wmemStep).Truncate(time.Minute)
	seen := make([]bool, keys*windowsSpanned(n))
	var pairs int64
	err := produceEach(ctx, brokers, topic, n, func(i int) *kgo.Record {
		k := mrand.IntN(keys)
		if at := k*windowsSpanned(n) + windowsSpanned(i+1) - 1; !seen[at] {
			seen[at] = true
			pairs++
		}
		return &kgo.Record{Key: fmt.Appendf(nil, "k%d", k), Value: values[i%len(values)], Timestamp: first.Add(time.Duration(i) * wmemStep)}
	})
	return pairs, err
}
