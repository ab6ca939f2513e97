package eos_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/state"
)

// heldStore holds its first Apply (a restore's) until gate closes.
type heldStore struct {
	state.Store
	gate  chan struct{}
	first bool
}

func (h *heldStore) Apply(ws []state.Write, cp state.Checkpoint) error {
	if h.first {
		<-h.gate
		h.first = false
	}
	return h.Store.Apply(ws, cp)
}

// A processor restores four partitions from a changelog another one
// wrote, one of them held (its store's restore waits on a gate): the
// three restored go on meanwhile, their new reports counted, committed
// and readable, while the held one shows restoring (its keys answered
// NotHeldError with Restoring, Health not ready, its new reports not
// counted); released, it restores and every count is exact. Before
// restores ran outside the loop (issue 46), nothing was handled until
// every partition had restored, and this test timed out.
func TestRestoredPartitionsGoOnWhileAnotherRestores(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rr := newRegionReports(t, ctx)
	rr.produce(400)
	run := func(txnID string, stores state.Factory) (*eos.Processor, func()) {
		p, err := eos.NewProcessor(eos.Count(), eos.Brokers(rr.brokers...), eos.Group("held"), eos.Topics("reports"), eos.TransactionalID(txnID),
			eos.CommitInterval(20*time.Millisecond), eos.Logger(testLogger(t)), eos.Changelog("held-changelog", eos.CreateChangelog(), eos.Stores(stores)))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		return p, func() {
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	exact := func(p *eos.Processor, keys func(int32) bool) bool {
		for key, n := range rr.want {
			part, err := p.State().PartitionOf([]byte(key))
			if err != nil {
				return false
			}
			if !keys(part) {
				continue
			}
			if v, _, err := p.State().Lookup([]byte(key)); err != nil || string(v) != strconv.Itoa(n) {
				return false
			}
		}
		return true
	}
	all := func(int32) bool { return true }
	first, stop := run("held-first", state.MemoryFactory())
	waitFor(t, 30*time.Second, "the first processor to count every report", func() bool { return exact(first, all) })
	stop()

	const held = 3
	gate := make(chan struct{})
	second, stop := run("held-second", func(_ string, p int32) (state.Store, error) {
		return &heldStore{Store: state.NewMemory(), gate: gate, first: p == held}, nil
	})
	defer stop()
	release := sync.OnceFunc(func() { close(gate) })
	defer release() // before stop: a failed wait must not leave the restore held
	rr.produce(400)
	others := func(p int32) bool { return p != held }
	waitFor(t, 30*time.Second, "the restored partitions to count the new reports while partition 3 restores", func() bool { return exact(second, others) })
	var notHeld *eos.NotHeldError
	checked := 0
	for key := range rr.want {
		if part, _ := second.State().PartitionOf([]byte(key)); part == held {
			if _, _, err := second.State().Lookup([]byte(key)); !errors.As(err, &notHeld) || !notHeld.Restoring {
				t.Errorf("%s (partition %d, held): %v, want a NotHeldError restoring", key, held, err)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatalf("no region is in partition %d", held)
	}
	if h := second.Health(); h.Ready() || len(h.Restoring["reports"]) != 1 || h.Restoring["reports"][0] != held {
		t.Errorf("health while partition %d restores: ready %v, restoring %v", held, h.Ready(), h.Restoring)
	}
	release()
	waitFor(t, 30*time.Second, "every count, partition 3 restored", func() bool { return exact(second, all) && second.Health().Ready() })
}
