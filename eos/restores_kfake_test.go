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

// heldRestores is a count whose changelog a first processor wrote, and a
// second processor restoring it through stores whose restores are held
// partition by partition.
type heldRestores struct {
	t      *testing.T
	rr     *regionReports
	second *eos.Processor
	gates  map[int32]chan struct{}
	open   map[int32]func()
}

// newHeldRestores counts rr's reports so far with a first processor,
// then starts the second, the restores of the partitions held held.
func newHeldRestores(t *testing.T, ctx context.Context, rr *regionReports, held ...int32) *heldRestores {
	h := &heldRestores{t: t, rr: rr, gates: map[int32]chan struct{}{}, open: map[int32]func(){}}
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
				t.Error(err)
			}
		}
	}
	first, stop := run("held-first", state.MemoryFactory())
	waitFor(t, 30*time.Second, "the first processor to count every report", func() bool { return h.exact(first, func(int32) bool { return true }) })
	stop()
	for _, p := range held {
		gate := make(chan struct{})
		h.gates[p], h.open[p] = gate, sync.OnceFunc(func() { close(gate) })
	}
	second, stop := run("held-second", func(_ string, p int32) (state.Store, error) {
		gate, held := h.gates[p]
		return &heldStore{Store: state.NewMemory(), gate: gate, first: held}, nil
	})
	t.Cleanup(stop)
	for _, open := range h.open {
		t.Cleanup(open) // before stop: a failed wait must not leave a restore held
	}
	h.second = second
	return h
}

// exact reports whether p's view holds the true count of every region
// of the partitions keys says.
func (h *heldRestores) exact(p *eos.Processor, keys func(int32) bool) bool {
	for key, n := range h.rr.want {
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

// restoring checks that the second processor answers each region of the
// partitions given as restoring, and lists them restoring in Health.
func (h *heldRestores) restoring(parts ...int32) {
	h.t.Helper()
	var notHeld *eos.NotHeldError
	for _, want := range parts {
		checked := 0
		for key := range h.rr.want {
			if part, _ := h.second.State().PartitionOf([]byte(key)); part == want {
				if _, _, err := h.second.State().Lookup([]byte(key)); !errors.As(err, &notHeld) || !notHeld.Restoring {
					h.t.Errorf("%s (partition %d, restoring): %v, want a NotHeldError restoring", key, want, err)
				}
				checked++
			}
		}
		if checked == 0 {
			h.t.Fatalf("no region is in partition %d", want)
		}
	}
	if hl := h.second.Health(); hl.Ready() || len(hl.Restoring["reports"]) != len(parts) {
		h.t.Errorf("health while partitions %v restore: ready %v, restoring %v", parts, hl.Ready(), hl.Restoring)
	}
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
	const held = 3
	h := newHeldRestores(t, ctx, rr, held)
	rr.produce(400)
	waitFor(t, 30*time.Second, "the restored partitions to count the new reports while partition 3 restores",
		func() bool { return h.exact(h.second, func(p int32) bool { return p != held }) })
	h.restoring(held)
	h.open[held]()
	waitFor(t, 30*time.Second, "every count, partition 3 restored", func() bool {
		return h.exact(h.second, func(int32) bool { return true }) && h.second.Health().Ready()
	})
}

// Six partitions restore, four at once: with four restores held, the
// other two wait in the queue, unfetched and restoring; once one held
// restore is let go, its partition counts and the queued ones take its
// place in turn, restore and count, while the other three stay held;
// then all.
func TestQueuedRestoresWaitTheirTurn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rr := newRegionReportsOf(t, ctx, 6)
	rr.produce(600)
	h := newHeldRestores(t, ctx, rr, 0, 1, 2, 3)
	rr.produce(600)
	time.Sleep(500 * time.Millisecond) // the queued ones have had time to be (wrongly) handled
	h.restoring(0, 1, 2, 3, 4, 5)
	h.open[0]()
	waitFor(t, 30*time.Second, "partitions 0, 4 and 5 to restore and count while 1 to 3 are held",
		func() bool { return h.exact(h.second, func(p int32) bool { return p == 0 || p >= 4 }) })
	h.restoring(1, 2, 3)
	for _, open := range h.open {
		open()
	}
	waitFor(t, 30*time.Second, "every count", func() bool {
		return h.exact(h.second, func(int32) bool { return true }) && h.second.Health().Ready()
	})
}
