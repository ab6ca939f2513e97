package main

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
)

// quiet is the runners' logger: errors only, so that the report stays
// readable (their default, slog.Default, logs at Info).
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

// maxPerCommit is high enough that the commit interval, not the record
// count, decides when each eos variant commits.
const maxPerCommit = 1_000_000

func eosPath(records int) path {
	return path{
		name: "eos", records: records, partitions: 6, output: true, physical: true,
		variants: []variant{
			{name: "at-least-once loop, 100ms", start: processor(eos.AtLeastOnce, 100*time.Millisecond)},
			{name: "raw GroupTransactSession, 100ms", start: rawSession(100 * time.Millisecond)},
			{name: "eos.Processor, 10ms", start: processor(eos.ExactlyOnce, 10*time.Millisecond)},
			{name: "eos.Processor, 100ms", start: processor(eos.ExactlyOnce, 100*time.Millisecond)},
			{name: "eos.Processor, 1s", start: processor(eos.ExactlyOnce, time.Second)},
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

func processor(sem eos.Semantics, interval time.Duration) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		opts := []eos.ProcessorOption{eos.Brokers(e.brokers...), eos.Group(e.group), eos.InputTopics(e.in),
			eos.WithSemantics(sem), eos.CommitInterval(interval), eos.MaxRecordsPerCommit(maxPerCommit), eos.Logger(quiet)}
		if sem == eos.ExactlyOnce {
			opts = append(opts, eos.TransactionalID(e.group+"-0"))
		}
		p, err := eos.NewProcessor(copyTo(e.out), opts...)
		if err != nil {
			return running{}, err
		}
		return running{progress: countCommitted(ctx, e), wait: background(func() error { return p.Run(ctx) })}, nil
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
		return running{progress: countCommitted(ctx, e), wait: background(loop)}, nil
	}
}
