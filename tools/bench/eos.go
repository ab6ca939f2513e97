package main

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
)

// quiet is the runners' logger: errors only, so that the report stays
// readable (their default, slog.Default, logs at Info).
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// maxPerCommit is high enough that the commit interval, not the record
// count, decides when each eos variant of the CPU-bound table commits.
const maxPerCommit = 1_000_000

// eosTable is the CPU-bound table: a copy handler over 6 partitions, the
// at-least-once loop and a raw GroupTransactSession at 100 ms against
// eos.Processor at each of intervals, and an idempotent producer alone.
func eosTable(sizes []int, intervals []time.Duration) wtable {
	return wtable{
		name: "eos", partitions: 6, sizes: sizes,
		// Guesses only: a run that copies the whole backlog within
		// its window is run again on a larger one.
		guess: func(size int) float64 { return 60e6 / float64(size+40) },
		variants: func(size int) []wvariant {
			vs := []wvariant{
				{name: "at-least-once loop, 100ms", start: processor(eos.AtLeastOnce, 100*time.Millisecond), role: roleAtLeastOnce},
				{name: "raw GroupTransactSession, 100ms", start: rawSession(100 * time.Millisecond), role: roleRaw},
			}
			for _, iv := range intervals {
				v := wvariant{name: "eos.Processor, " + iv.String(), start: processor(eos.ExactlyOnce, iv)}
				if iv == 100*time.Millisecond {
					v.role = roleGoal
				}
				vs = append(vs, v)
			}
			return append(vs, wvariant{name: "physical: idempotent producer", start: producerAlone(size), producer: true})
		},
	}
}

// singleTable is the single-partition table: eos.Processor with its
// defaults copying 100 B records through a one-partition topic, against
// an idempotent producer alone writing to one, with candidate settings
// that show what bounds the copy. Every processor here reports its
// transactions to a probe (WithMetrics, and a kgo hook timing requests):
// observation only, no setting changes with it.
func singleTable() wtable {
	const mib = 1 << 20
	client := func(opts ...kgo.Opt) eos.Option { return eos.ClientOptions(opts...) }
	return wtable{
		name: "single", partitions: 1, sizes: []int{100},
		guess: func(int) float64 { return 150_000 },
		variants: func(size int) []wvariant {
			return []wvariant{
				{name: "physical: idempotent producer (franz-go defaults)", start: producerAlone(size), producer: true, role: roleProducer},
				{name: "eos.Processor, defaults", start: probed(eos.ExactlyOnce), role: roleGoal},
				{name: "at-least-once loop, defaults", start: probed(eos.AtLeastOnce)},
				{name: "eos.Processor, MaxRecordsPerCommit 10000", start: probed(eos.ExactlyOnce, eos.MaxRecordsPerCommit(10_000))},
				{name: "eos.Processor, MaxRecordsPerCommit 100000", start: probed(eos.ExactlyOnce, eos.MaxRecordsPerCommit(100_000))},
				{name: "at-least-once loop, MaxRecordsPerCommit 10000", start: probed(eos.AtLeastOnce, eos.MaxRecordsPerCommit(10_000))},
				{name: "eos.Processor, FetchMaxPartitionBytes 8 MiB", start: probed(eos.ExactlyOnce, client(kgo.FetchMaxPartitionBytes(8*mib)))},
				{name: "eos.Processor, ProducerLinger 0", start: probed(eos.ExactlyOnce, client(kgo.ProducerLinger(0)))},
				{name: "eos.Processor, MaxRecordsPerCommit 10000, FetchMaxPartitionBytes 8 MiB", start: probed(eos.ExactlyOnce,
					eos.MaxRecordsPerCommit(10_000), client(kgo.FetchMaxPartitionBytes(8*mib)))},
			}
		},
	}
}

// copyTo keeps the input's timestamp on the copy, so that a reader can
// measure end-to-end latency.
func copyTo(out string) eos.HandlerFunc {
	return func(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		return []*kgo.Record{{Topic: out, Key: in.Key, Value: in.Value, Timestamp: in.Timestamp}}, nil
	}
}

// processor is the CPU-bound table's eos.Processor (and, under
// AtLeastOnce, its at-least-once loop): the commit interval decides when
// it commits.
func processor(sem eos.Semantics, interval time.Duration) func(context.Context, *env) (running, error) {
	return newProcessor(func(e *env) []eos.ProcessorOption {
		opts := []eos.ProcessorOption{eos.Brokers(e.brokers...), eos.Group(e.group), eos.Topics(e.in),
			eos.WithSemantics(sem), eos.CommitInterval(interval), eos.MaxRecordsPerCommit(maxPerCommit), eos.Logger(quiet)}
		if sem == eos.ExactlyOnce {
			opts = append(opts, eos.TransactionalID(e.group+"-0"))
		}
		return opts
	}, nil)
}

// probed is an eos.Processor with its defaults (Brokers, Group,
// Topics, and under ExactlyOnce TransactionalID) plus extra, and a
// probe that sees its transactions and requests.
func probed(sem eos.Semantics, extra ...eos.ProcessorOption) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		pr := newProbe()
		return newProcessor(func(e *env) []eos.ProcessorOption {
			opts := []eos.ProcessorOption{eos.Brokers(e.brokers...), eos.Group(e.group), eos.Topics(e.in)}
			if sem == eos.ExactlyOnce {
				opts = append(opts, eos.TransactionalID(e.group+"-0"))
			} else {
				opts = append(opts, eos.WithSemantics(sem))
			}
			opts = append(opts, eos.WithMetrics(pr), eos.ClientOptions(kgo.WithHooks(pr)))
			return append(opts, extra...)
		}, pr)(ctx, e)
	}
}

// newProcessor starts an eos.Processor copying e.in to e.out. Its progress
// is left to the caller (the group's committed offsets, or an observer).
func newProcessor(options func(e *env) []eos.ProcessorOption, pr *probe) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		p, err := eos.NewProcessor(copyTo(e.out), options(e)...)
		if err != nil {
			return running{}, err
		}
		return running{probe: pr, wait: background(func() error { return p.Run(ctx) })}, nil
	}
}

// countCommitted counts the records a read_committed reader sees on the
// output until ctx ends.
func countCommitted(ctx context.Context, e *env) func() int64 {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(e.out),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		fail(err)
	}
	var n atomic.Int64
	go func() {
		defer cl.Close()
		for ctx.Err() == nil {
			n.Add(int64(cl.PollFetches(ctx).NumRecords()))
		}
	}()
	return n.Load
}

// producerAlone is the physical reference: an idempotent producer with
// franz-go's defaults writing records of size bytes to e.out as fast as
// the broker takes them; its progress counts acknowledged records.
func producerAlone(size int) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.out))
		if err != nil {
			return running{}, err
		}
		values := randomValues(4096, size)
		var acked atomic.Int64
		promise := func(_ *kgo.Record, err error) {
			if err == nil {
				acked.Add(1)
			}
		}
		loop := func() error {
			defer cl.Close()
			var key []byte
			for i := 0; ctx.Err() == nil; i++ {
				key = strconv.AppendInt(append(key[:0:0], 'k'), int64(i), 10)
				cl.Produce(ctx, &kgo.Record{Key: key, Value: values[i%len(values)]}, promise)
			}
			return nil
		}
		return running{progress: acked.Load, wait: background(loop)}, nil
	}
}

// rawSession is the same copy loop written directly on franz-go's
// GroupTransactSession, as its documentation shows it, with the produce
// error check that correctness needs: the reference for what eoskit adds.
func rawSession(interval time.Duration) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		sess, err := kgo.NewGroupTransactSession(
			kgo.SeedBrokers(e.brokers...),
			kgo.TransactionalID(e.group+"-0"),
			kgo.ConsumerGroup(e.group),
			kgo.ConsumeTopics(e.in),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		)
		if err != nil {
			return running{}, err
		}
		loop := func() error {
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
						sess.Produce(ctx, &kgo.Record{Topic: e.out, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}, func(_ *kgo.Record, err error) {
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
		return running{wait: background(loop)}, nil
	}
}
