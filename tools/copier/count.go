package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/state/pebblestore"
	"github.com/eoskit/eoskit/window"
)

// countInputs is the stateful path: eos.Count by key, its store (memory or
// pebble under stateDir) restored from changelog, one update per changed
// key per transaction to out. naive, the negative control, counts in a Go
// map instead, outside the transaction, and emits every new count to out
// with no changelog: a restart or a partition moved starts its keys from
// zero again, and an aborted transaction's counts stay counted.
func countInputs(ctx context.Context, opts []eos.ProcessorOption, st stateful, out, instance string, naive bool, delay time.Duration) error {
	var handler eos.HandlerFunc
	if naive {
		var mu sync.Mutex
		counts := map[string]int64{}
		handler = func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			time.Sleep(delay)
			mu.Lock()
			counts[string(r.Key)]++
			n := counts[string(r.Key)]
			mu.Unlock()
			return []*kgo.Record{{Topic: out, Key: r.Key, Value: strconv.AppendInt(nil, n, 10)}}, nil
		}
	} else {
		var stores state.Factory
		switch st.store {
		case "memory":
			stores = state.MemoryFactory()
		case "pebble":
			if st.dir == "" {
				return fmt.Errorf("-store pebble needs -state-dir")
			}
			stores = pebblestore.Factory(st.dir, nil)
		default:
			return fmt.Errorf("unknown store %q (memory or pebble)", st.store)
		}
		if st.restoreDelay > 0 {
			stores = slowResets(stores, st.restoreDelay)
		}
		count := eos.Count()
		if st.window > 0 {
			spec := window.Tumbling(st.window, (st.window / 3).Truncate(time.Millisecond))
			spec.Retention = 24 * time.Hour
			var err error
			if count, err = eos.WindowedCount(spec); err != nil {
				return err
			}
		}
		handler = func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			time.Sleep(delay)
			return count(ctx, r)
		}
		opts = append(opts, eos.Changelog(st.changelog, eos.EmitUpdates(out), eos.Stores(stores)))
	}
	p, err := eos.NewProcessor(handler, opts...)
	if err != nil {
		return err
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go reportRestoring(watchCtx, p, instance)
	return p.Run(ctx)
}

// reportRestoring prints "copier: restoring [partitions] (copier name)" to stderr each
// time the partitions the processor restores change (an empty list once
// none is): the chaos suite rebalances the group while one is restoring.
func reportRestoring(ctx context.Context, p *eos.Processor, instance string) {
	var last []int32
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var now []int32
		for _, ps := range p.Health().Restoring {
			now = append(now, ps...)
		}
		slices.Sort(now)
		if !slices.Equal(now, last) {
			fmt.Fprintf(os.Stderr, "copier: restoring %v (copier %s)\n", now, instance)
			last = now
		}
	}
}

// slowResets makes the stores of f take d longer to Reset, which a restore
// does before it reads a changelog from its start (every restore of a
// memory store; a pebble store's from an empty disk): such a restore then
// lasts long enough for the chaos suite to rebalance the group under it.
func slowResets(f state.Factory, d time.Duration) state.Factory {
	return func(topic string, partition int32) (state.Store, error) {
		s, err := f(topic, partition)
		return slowReset{s, d}, err
	}
}

type slowReset struct {
	state.Store
	d time.Duration
}

func (s slowReset) Reset(cp state.Checkpoint) error {
	time.Sleep(s.d)
	return s.Store.Reset(cp)
}

// stateDirOf is the copier's own store directory under root: each
// instance name keeps its stores across its restarts, as a host's disk.
func stateDirOf(root, instance string) string {
	if root == "" {
		return ""
	}
	return filepath.Join(root, instance)
}
