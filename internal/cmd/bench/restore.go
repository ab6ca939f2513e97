package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/changelog"
	"github.com/eoskit/eoskit/state"
)

// The restore part (issue 27, keyed state): how fast a processor gets a
// partition's state back from its changelog, against a plain read_committed
// consumer reading the same changelog (the floor: a restore reads what it
// reads and applies it). A changelog of 6 partitions holds one record per
// key, 100 B random values; each run reads all of it once per variant, in
// turn, and a pebble store restarted on its directory restores the tail
// past its checkpoint (none). Goals: a memory store's restore ≥ 0.5x the
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
	if err := b.fillChangelog(ctx, topic, keys); err != nil {
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
		r, err := changelog.NewRestorer(conn)
		if err != nil {
			return 0, 0, err
		}
		defer r.Close()
		start, n := time.Now(), 0
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
			return repeated(func() (time.Duration, int, error) { return b.readChangelog(ctx, topic) })
		}},
		{"restore into the memory store (every assignment)", func(int) (time.Duration, int, error) {
			return repeated(func() (time.Duration, int, error) {
				return restoreAll(func(int32) (state.Store, error) { return state.NewMemory(), nil })
			})
		}},
		{"restore into an empty pebble store (a new disk)", func(round int) (time.Duration, int, error) {
			return restoreAll(func(p int32) (state.Store, error) { return state.OpenPebble(pebbleDir(round, p), nil) })
		}},
		{"pebble store restarted on its directory (the tail past its checkpoint)", func(round int) (time.Duration, int, error) {
			return restoreAll(func(p int32) (state.Store, error) { return state.OpenPebble(pebbleDir(round, p), nil) })
		}},
	}
	took := make([][]time.Duration, len(variants))
	records := make([]int, len(variants))
	for round := range b.runs {
		for i, v := range variants {
			d, n, err := v.run(round)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			took[i], records[i] = append(took[i], d), n
			fmt.Fprintf(os.Stderr, "bench: restore: %s: %d records in %s\n", v.name, n, d.Round(time.Millisecond))
		}
	}

	rates := func(i int) []float64 {
		var rs []float64
		for _, d := range took[i] {
			rs = append(rs, float64(max(records[i], 1))/d.Seconds())
		}
		return rs
	}
	floor := median(rates(0))
	fmt.Fprintf(w, "\nrestore: a compacted changelog of %d partitions, %d keys, %d B random values: each variant reads it all (a restore: partition after partition, as a processor's loop does), the first two again and again for at least %s a run; median of %d interleaved runs (min-max; spread = (max-min)/median). Goals: the memory store's restore ≥ %.2fx the plain consumer; a pebble restart under %s\n\n",
		restorePartitions, keys, restoreValue, restoreMinRun, b.runs, goalRestoreVsRead, goalPebbleRestart)
	fmt.Fprintln(w, "| variant | records read a run | time a run (median) | records/s | min-max | spread | vs plain consumer | goals |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for i, v := range variants {
		rs := rates(i)
		d := medianDuration(took[i])
		goal := ""
		switch i {
		case 1:
			goal = fmt.Sprintf("≥ %.2fx: %s", goalRestoreVsRead, metOrMissed(median(rs)/floor >= goalRestoreVsRead))
		case 3:
			goal = fmt.Sprintf("< %s: %s", goalPebbleRestart, metOrMissed(d < goalPebbleRestart))
		}
		if i == 3 { // what it reads is what it missed: no rate
			fmt.Fprintf(w, "| %s | %d | %s | - | - | - | - | %s |\n", v.name, records[i], d.Round(time.Millisecond), goal)
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %.2fx | %s |\n", v.name, records[i], d.Round(time.Millisecond), rateCells(rs), median(rs)/floor, goal)
	}
	return nil
}

// fillChangelog writes keys records to topic, one per key, random values.
func (b *bench) fillChangelog(ctx context.Context, topic string, keys int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(5*time.Millisecond), kgo.MaxBufferedRecords(100_000))
	if err != nil {
		return err
	}
	defer cl.Close()
	errc := make(chan error, 1)
	for i := range keys {
		v := make([]byte, restoreValue)
		rand.Read(v)
		cl.Produce(ctx, &kgo.Record{Key: []byte(fmt.Sprintf("key-%08d", i)), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-errc:
		return fmt.Errorf("fill %s: %w", topic, err)
	default:
		return nil
	}
}

// readChangelog reads every record of topic read_committed, from the
// start to the end offsets listed first, with a plain consumer.
func (b *bench) readChangelog(ctx context.Context, topic string) (time.Duration, int, error) {
	ends, err := b.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, 0, err
	}
	want := map[int32]int64{}
	left := 0
	ends.Each(func(o kadm.ListedOffset) {
		if want[o.Partition] = o.Offset; o.Offset > 0 {
			left++
		}
	})
	start := time.Now()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	n := 0
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return 0, 0, err
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, r := range p.Records {
				n++
				if r.Offset+1 == want[r.Partition] {
					left--
				}
			}
		})
	}
	return time.Since(start), n, nil
}

func medianDuration(ds []time.Duration) time.Duration {
	fs := make([]float64, len(ds))
	for i, d := range ds {
		fs[i] = float64(d)
	}
	return time.Duration(median(fs))
}
