package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/outbox"
)

// outboxPath measures the relay: records already committed to the outbox
// (the env's own slot, created before they were written) relayed to the
// output topic. Baseline: the at-least-once relay; physical reference: an
// idempotent producer writing the same records from memory. The env's
// input topic serves as the position topic.
func outboxPath(records int) path {
	return path{
		name: "outbox", records: records, partitions: 6, output: true, slot: true,
		seedInput: seedOutbox, latencyInput: writeOutboxTimed,
		variants: []variant{
			{name: "at-least-once relay", start: relay(eos.AtLeastOnce)},
			{name: "physical: idempotent producer", start: idempotentProducer, throughputOnly: true},
			{name: "outbox.Relay (exactly-once), 100ms", start: relay(eos.ExactlyOnce)},
		},
	}
}

func relay(sem eos.Semantics) func(context.Context, *env) (running, error) {
	return func(ctx context.Context, e *env) (running, error) {
		r, err := outbox.NewRelay(e.pool, outbox.Brokers(e.brokers...), outbox.Slot(e.slot), outbox.PositionTopic(e.in),
			outbox.TransactionalID(e.group), outbox.WithSemantics(sem),
			outbox.Logger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
		if err != nil {
			return running{}, err
		}
		return running{progress: countCommitted(ctx, e), wait: background(func() error { return r.Run(ctx) })}, nil
	}
}

// idempotentProducer writes the env's records from memory: what the
// broker takes from one client with nothing in between.
func idempotentProducer(ctx context.Context, e *env) (running, error) {
	p, err := eos.NewIdempotentProducer(eos.Brokers(e.brokers...))
	if err != nil {
		return running{}, err
	}
	var done atomic.Int64
	wait := background(func() error {
		defer p.Close()
		for i, v := range e.values {
			r := &kgo.Record{Topic: e.out, Key: fmt.Appendf(nil, "k%d", i), Value: v}
			p.ProduceAsync(ctx, r, func(_ *kgo.Record, err error) {
				if err == nil {
					done.Add(1)
				}
			})
		}
		if err := p.Flush(ctx); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})
	return running{progress: done.Load, wait: wait}, nil
}

// seedOutbox commits n records of size bytes to the outbox, 1,000 per
// transaction, and keeps them for the physical reference.
func seedOutbox(ctx context.Context, e *env, n, size int) error {
	values := randomValues(4096, size)
	e.values = make([][]byte, n)
	for from := 0; from < n; from += 1000 {
		recs := make([]*kgo.Record, 0, 1000)
		for i := from; i < min(from+1000, n); i++ {
			e.values[i] = values[i%len(values)]
			recs = append(recs, &kgo.Record{Topic: e.out, Key: fmt.Appendf(nil, "k%d", i), Value: e.values[i]})
		}
		if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, recs...) }); err != nil {
			return err
		}
	}
	return nil
}

// writeOutboxTimed commits one record per transaction at rate per second
// for n records, from four connections. The relay stamps each record with
// its transaction's commit time, from which the observer measures.
func writeOutboxTimed(ctx context.Context, e *env, n, rate int, value []byte) error {
	const writers = 4
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second * writers / time.Duration(rate))
			defer tick.Stop()
			for i := w; i < n; i += writers {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				r := &kgo.Record{Topic: e.out, Key: fmt.Appendf(nil, "k%d", i), Value: value}
				if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, r) }); err != nil && !errors.Is(err, context.Canceled) {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
