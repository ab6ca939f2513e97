package eos

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// handleAll handles the records of one poll: one at a time in poll order,
// or, under [Concurrency] above 1, in lanes that run at once, up to the
// bound: a lane per input partition (PartitionOrder) or per group of keys
// within a partition (KeyOrder), each handling its records in offset order
// and producing each one's outputs before it handles the next, so that
// outputs keep their inputs' order per partition (per key). A batch
// isolating a failure runs one at a time. It reports whether every record
// was handled; once one lane fails, the others stop at their next record.
func (rn *runner) handleAll(ctx, hctx context.Context, b *batch, fetches kgo.Fetches) bool {
	n := rn.p.cfg.concurrency
	if n <= 1 || rn.isolate {
		ok := true
		fetches.EachRecord(func(r *kgo.Record) {
			ok = ok && rn.handle(ctx, hctx, b, r)
		})
		return ok
	}
	lanes := laneRecords(fetches, n, rn.p.cfg.order)
	var failed atomic.Bool
	var wg sync.WaitGroup
	slots := make(chan struct{}, n)
	for _, lane := range lanes {
		slots <- struct{}{}
		if failed.Load() {
			<-slots
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			for _, r := range lane {
				if failed.Load() || !rn.handle(ctx, hctx, b, r) {
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	return !failed.Load()
}

// laneRecords splits a poll's records into lanes that may run at once: one
// per partition, or, under KeyOrder, up to n per partition by a hash of the
// key (records without a key share one), each in offset order.
func laneRecords(fetches kgo.Fetches, n int, order Order) [][]*kgo.Record {
	var lanes [][]*kgo.Record
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		if order != KeyOrder {
			lanes = append(lanes, p.Records)
			return
		}
		byKey := make([][]*kgo.Record, n)
		for _, r := range p.Records {
			i := 0
			if r.Key != nil {
				i = int(fnv32a(r.Key) % uint32(n))
			}
			byKey[i] = append(byKey[i], r)
		}
		for _, l := range byKey {
			if len(l) > 0 {
				lanes = append(lanes, l)
			}
		}
	})
	return lanes
}

// fnv32a is FNV-1a over b, without hash/fnv's allocation per record.
func fnv32a(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	return h
}
