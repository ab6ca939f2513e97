package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/changelog"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/state/pebblestore"
)

// The restore part (issue 27, keyed state): how fast a processor gets a
// partition's state back from its changelog, against a plain read_committed
// consumer reading the same changelog (the floor: a restore reads what it
// reads and applies it). A changelog of 6 partitions holds one record per
// key, 100 B random values, written in transactions as a processor writes
// it (markers included); each run reads all of it per variant, in turn,
// and a pebble store restarted on its directory restores the tail past its
// checkpoint (none). Goals: a memory store's restore ≥ 0.5x the
// plain consumer; a pebble restart under 2 s.
const (
	restorePartitions = 6
	restoreValue      = 100
	goalRestoreVsRead = 0.5
	goalPebbleRestart = 2 * time.Second
	// restoreMinRun is how long each measurement of the rated variants
	// reads for, the changelog read again as many times as it takes.
	restoreMinRun = 3 * time.Second
)

// restore runs the restore part over a changelog of keys keys.
func (b *bench) restore(ctx context.Context, w io.Writer, keys int) error {
	topic := "bench-changelog-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	compact := "compact"
	if _, err := b.adm.CreateTopic(ctx, restorePartitions, -1, map[string]*string{"cleanup.policy": &compact}, topic); err != nil {
		return fmt.Errorf("create %s: %w", topic, err)
	}
	defer func() { _, _ = b.adm.DeleteTopics(context.WithoutCancel(ctx), topic) }()
	counts, err := b.fillChangelog(ctx, topic, keys)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "eoskit-bench-restore-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	conn := []kgo.Opt{kgo.SeedBrokers(b.brokers...)}
	quiet := slog.New(slog.DiscardHandler)
	restoreAll := func(open func(p int32) (state.Store, error)) (time.Duration, int, error) {
		start, n := time.Now(), 0 // the restorer's client counts, as the consumer's does
		r, err := changelog.NewRestorer(conn)
		if err != nil {
			return 0, 0, err
		}
		defer r.Close()
		for p := range int32(restorePartitions) {
			s, err := open(p)
			if err != nil {
				return 0, 0, err
			}
			res, err := r.Restore(ctx, topic, p, s, changelog.Options{Timeout: 10 * time.Minute, Logger: quiet})
			if cerr := s.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return 0, 0, err
			}
			n += res.Records
		}
		return time.Since(start), n, nil
	}
	type variant struct {
		name string
		run  func(round int) (time.Duration, int, error)
	}
	pebbleDir := func(round int, p int32) string {
		return filepath.Join(dir, strconv.Itoa(round), strconv.Itoa(int(p)))
	}
	// repeated runs f until it has run for restoreMinRun: a read of 1M
	// records takes a fraction of a second, too short to be stable.
	repeated := func(f func() (time.Duration, int, error)) (time.Duration, int, error) {
		var took time.Duration
		n := 0
		for took < restoreMinRun {
			d, m, err := f()
			if err != nil {
				return 0, 0, err
			}
			took, n = took+d, n+m
		}
		return took, n, nil
	}
	variants := []variant{
		{"plain consumer, read_committed, from the start (the floor)", func(int) (time.Duration, int, error) {
			return repeated(func() (time.Duration, int, error) { return b.readChangelog(ctx, topic, counts) })
		}},
		{"restore into the memory store (every assignment)", func(int) (time.Duration, int, error) {
			return repeated(func() (time.Duration, int, error) {
				return restoreAll(func(int32) (state.Store, error) { return state.NewMemory(), nil })
			})
		}},
		{"restore into an empty pebble store (a new disk)", func(round int) (time.Duration, int, error) {
			return restoreAll(func(p int32) (state.Store, error) { return pebblestore.Open(pebbleDir(round, p), nil) })
		}},
		{"pebble store restarted on its directory (the tail past its checkpoint)", func(round int) (time.Duration, int, error) {
			return restoreAll(func(p int32) (state.Store, error) { return pebblestore.Open(pebbleDir(round, p), nil) })
		}},
	}
	took := make([][]time.Duration, len(variants))
	records := make([][]int, len(variants))
	for round := range b.runs {
		for i, v := range variants {
			d, n, err := v.run(round)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			took[i], records[i] = append(took[i], d), append(records[i], n)
			fmt.Fprintf(os.Stderr, "bench: restore: %s: %d records in %s\n", v.name, n, d.Round(time.Millisecond))
		}
	}

	rates := func(i int) []float64 {
		var rs []float64
		for k, d := range took[i] {
			rs = append(rs, float64(max(records[i][k], 1))/d.Seconds())
		}
		return rs
	}
	floor := median(rates(0))
	fmt.Fprintf(w, "\nrestore: a compacted changelog of %d partitions, %d keys, %d B random values: each variant reads it all (partition after partition through one restorer; a processor restores four at once, see the next table), the first two again and again for at least %s a run; median of %d interleaved runs (min-max; spread = (max-min)/median). Goals: the memory store's restore ≥ %.2fx the plain consumer; a pebble restart under %s\n\n",
		restorePartitions, keys, restoreValue, restoreMinRun, b.runs, goalRestoreVsRead, goalPebbleRestart)
	fmt.Fprintln(w, "| variant | records read a run | time a run (median) | records/s | min-max | spread | vs plain consumer | goals |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for i, v := range variants {
		rs := rates(i)
		d := medianDuration(took[i])
		read := slices.Max(records[i])
		goal := ""
		switch i {
		case 1:
			goal = fmt.Sprintf("≥ %.2fx: %s", goalRestoreVsRead, metOrMissed(median(rs)/floor >= goalRestoreVsRead))
		case 3:
			goal = fmt.Sprintf("< %s: %s", goalPebbleRestart, metOrMissed(d < goalPebbleRestart))
		}
		if i == 3 { // what it reads is what it missed: no rate
			fmt.Fprintf(w, "| %s | %d | %s | - | - | - | - | %s |\n", v.name, read, d.Round(time.Millisecond), goal)
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %.2fx | %s |\n", v.name, read, d.Round(time.Millisecond), rateCells(rs), median(rs)/floor, goal)
	}
	perKey, err := memoryHeapPerKey(func() ([]state.Store, error) {
		var stores []state.Store
		_, _, err := restoreAll(func(int32) (state.Store, error) {
			s := state.NewMemory()
			stores = append(stores, s)
			return keepOpen{s}, nil
		})
		return stores, err
	})
	if err != nil {
		return fmt.Errorf("memory store heap: %w", err)
	}
	fmt.Fprintf(w, "\nThe memory store's heap, restored: %.0f B per key (keys of %d B, values of %d B: %.0f B more than they), the live heap's growth after a GC over %d keys.\n",
		perKey, len("key-00000000"), restoreValue, perKey-float64(len("key-00000000")+restoreValue), keys)
	return nil
}

// keepOpen is a store whose Close does nothing, so that the stores
// restored for memoryHeapPerKey stay live.
type keepOpen struct{ state.Store }

func (keepOpen) Close() error { return nil }

// memoryHeapPerKey returns the live heap's growth per key over what fill
// restored, measured after a GC before and after.
func memoryHeapPerKey(fill func() ([]state.Store, error)) (float64, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	stores, err := fill()
	if err != nil {
		return 0, err
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	keys := 0
	for _, s := range stores {
		keys += s.(*state.Memory).Len()
		_ = s.Close()
	}
	if keys == 0 {
		return 0, fmt.Errorf("no key restored")
	}
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(keys), nil
}

// fillChangelog writes keys records to topic, one per key, random values,
// as a processor does: in transactions (of 10,000 records here), so that
// the changelog holds their markers. It returns the records per partition.
func (b *bench) fillChangelog(ctx context.Context, topic string, keys int) (map[int32]int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.DefaultProduceTopic(topic),
		kgo.TransactionalID(topic), kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var mu sync.Mutex
	counts := map[int32]int{}
	var failed error
	for i := 0; i < keys; i += 10_000 {
		if err := cl.BeginTransaction(); err != nil {
			return nil, err
		}
		for j := i; j < min(i+10_000, keys); j++ {
			v := make([]byte, restoreValue)
			rand.Read(v)
			cl.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("key-%08d", j)), Value: v}, func(r *kgo.Record, err error) {
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed = cmp.Or(failed, err)
					return
				}
				counts[r.Partition]++
			})
		}
		if err := cl.Flush(ctx); err != nil {
			return nil, err
		}
		if failed != nil {
			return nil, fmt.Errorf("fill %s: %w", topic, failed)
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			return nil, fmt.Errorf("fill %s: commit: %w", topic, err)
		}
	}
	return counts, nil
}

// readChangelog reads topic read_committed from the start with a plain
// consumer until it has read counts records of each partition, within a
// minute.
func (b *bench) readChangelog(ctx context.Context, topic string, counts map[int32]int) (time.Duration, int, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	read := map[int32]int{}
	n, left := 0, len(counts)
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return 0, 0, fmt.Errorf("read %d of %d records within a minute", n, total(counts))
		}
		if err := fs.Err0(); err != nil {
			return 0, 0, err
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			n += len(p.Records)
			before := read[p.Partition]
			read[p.Partition] += len(p.Records)
			if before < counts[p.Partition] && read[p.Partition] >= counts[p.Partition] {
				left--
			}
		})
	}
	return time.Since(start), n, nil
}

// total sums counts.
func total(counts map[int32]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

func medianDuration(ds []time.Duration) time.Duration {
	fs := make([]float64, len(ds))
	for i, d := range ds {
		fs[i] = float64(d)
	}
	return time.Duration(median(fs))
}
