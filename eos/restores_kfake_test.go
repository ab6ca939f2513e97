package eos_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

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
	return newHeldRestoresWith(t, ctx, rr, nil, held...)
}

// newHeldRestoresWith is newHeldRestores with the second processor given
// opts too.
func newHeldRestoresWith(t *testing.T, ctx context.Context, rr *regionReports, opts []eos.ProcessorOption, held ...int32) *heldRestores {
	h := &heldRestores{t: t, rr: rr, gates: map[int32]chan struct{}{}, open: map[int32]func(){}}
	first, _, stop := runCount(t, ctx, rr, "held-first", state.MemoryFactory())
	waitFor(t, 30*time.Second, "the first processor to count every report", func() bool { return h.exact(first, func(int32) bool { return true }) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, p := range held {
		gate := make(chan struct{})
		h.gates[p], h.open[p] = gate, sync.OnceFunc(func() { close(gate) })
	}
	second, _, stop := runCount(t, ctx, rr, "held-second", func(_ string, p int32) (state.Store, error) {
		gate, held := h.gates[p]
		return &heldStore{Store: state.NewMemory(), gate: gate, first: held}, nil
	}, opts...)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	for _, open := range h.open {
		t.Cleanup(open) // before stop: a failed wait must not leave a restore held
	}
	h.second = second
	return h
}

// runCount runs a count of rr's reports in group "held" (its changelog
// held-changelog) under txnID with stores and opts; done closes when Run
// returns, by itself or stopped; stop ends it and returns what Run
// returned (nil when stopped).
func runCount(t *testing.T, ctx context.Context, rr *regionReports, txnID string, stores state.Factory, opts ...eos.ProcessorOption) (p *eos.Processor, done <-chan struct{}, stop func() error) {
	t.Helper()
	p, err := eos.NewProcessor(eos.Count(), append([]eos.ProcessorOption{eos.Brokers(rr.brokers...), eos.Group("held"), eos.Topics("reports"),
		eos.TransactionalID(txnID), eos.CommitInterval(20 * time.Millisecond), eos.Logger(testLogger(t)),
		eos.Changelog("held-changelog", eos.CreateChangelog(), eos.Stores(stores))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	finished := make(chan struct{})
	var result error
	go func() { result = p.Run(runCtx); close(finished) }()
	return p, finished, func() error {
		cancel()
		select {
		case <-finished:
			return result
		case <-time.After(30 * time.Second):
			return errors.New("Run did not return within 30 s of its context's end")
		}
	}
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
	for name, opts := range map[string][]eos.ProcessorOption{
		"one lane": nil,
		// Lanes fed across polls: a restore must not run beside handlers
		// of its partition, nor the lanes hold the restored ones.
		"Concurrency(4)": {eos.Concurrency(4, eos.PartitionOrder)},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rr := newRegionReports(t, ctx)
			rr.produce(400)
			const held = 3
			h := newHeldRestoresWith(t, ctx, rr, opts, held)
			rr.produce(400)
			waitFor(t, 30*time.Second, "the restored partitions to count the new reports while partition 3 restores",
				func() bool { return h.exact(h.second, func(p int32) bool { return p != held }) })
			h.restoring(held)
			h.open[held]()
			waitFor(t, 30*time.Second, "every count, partition 3 restored", func() bool {
				return h.exact(h.second, func(int32) bool { return true }) && h.second.Health().Ready()
			})
		})
	}
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

// failingStore fails its first Apply (a restore's) with err, or every
// one if always.
type failingStore struct {
	state.Store
	err    error
	always bool
	failed bool
}

func (f *failingStore) Apply(ws []state.Write, cp state.Checkpoint) error {
	if f.always || !f.failed {
		f.failed = true
		return f.err
	}
	return f.Store.Apply(ws, cp)
}

// A background restore whose store fails: once (a disk's hiccup), the
// restore reads that fetch again and goes on, and every count ends
// exact; for good (the store closed under it), Run ends within seconds
// with a *state.RestoreError naming the partition, wrapping the store's
// error, the other partitions restored and counting meanwhile or not.
func TestABackgroundRestoreThatFails(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		err    error
		always bool
	}{
		{"once", errors.New("disk hiccup"), false},
		{"for good", state.ErrClosed, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rr := newRegionReports(t, ctx)
			rr.produce(400)
			h := &heldRestores{t: t, rr: rr}
			first, _, stop := runCount(t, ctx, rr, "held-first", state.MemoryFactory())
			waitFor(t, 30*time.Second, "the first processor to count every report", func() bool { return h.exact(first, func(int32) bool { return true }) })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			const failing = 2
			var mu sync.Mutex
			var stores []*failingStore
			second, done, stop := runCount(t, ctx, rr, "held-second", func(_ string, p int32) (state.Store, error) {
				if p == failing {
					fs := &failingStore{Store: state.NewMemory(), err: c.err, always: c.always}
					mu.Lock()
					stores = append(stores, fs)
					mu.Unlock()
					return fs, nil
				}
				return state.NewMemory(), nil
			})
			defer stop()
			rr.produce(400)
			if !c.always {
				waitFor(t, 30*time.Second, "every count, the failed apply read again", func() bool {
					return h.exact(second, func(int32) bool { return true })
				})
				mu.Lock()
				defer mu.Unlock()
				if len(stores) != 1 || !stores[0].failed {
					t.Fatalf("%d stores opened for partition %d, want one, whose apply failed once", len(stores), failing)
				}
				select {
				case <-done:
					t.Fatalf("Run ended: %v", stop())
				default:
				}
				if err := stop(); err != nil {
					t.Fatalf("Run: %v", err)
				}
				return
			}
			select {
			case <-done:
				err := stop()
				var re *state.RestoreError
				if !errors.Is(err, c.err) || !errors.As(err, &re) || re.Partition != failing {
					t.Fatalf("Run returned %v, want a *state.RestoreError naming partition %d, wrapping the store's error", err, failing)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not end within 20 s of a background restore's failure")
			}
		})
	}
}

// An eager rebalance (the range balancer) while a partition's restore is
// held: a second member joins, every partition is revoked and assigned
// again, the held restore cancelled or finished; once let go, the two
// members' views together hold every true count, none twice.
func TestAnEagerRebalanceDuringAHeldRestore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rr := newRegionReports(t, ctx)
	rr.produce(400)
	eager := eos.ClientOptions(kgo.Balancers(kgo.RangeBalancer()))
	const held = 3
	h := newHeldRestoresWith(t, ctx, rr, []eos.ProcessorOption{eager}, held)
	rr.produce(400)
	waitFor(t, 30*time.Second, "the restored partitions to count while partition 3 restores",
		func() bool { return h.exact(h.second, func(p int32) bool { return p != held }) })
	third, _, stop := runCount(t, ctx, rr, "held-third", state.MemoryFactory(), eager)
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, 30*time.Second, "the third member to get partitions", func() bool { return len(third.Health().Assigned["reports"]) > 0 })
	rr.produce(400)
	h.open[held]()
	waitFor(t, 30*time.Second, "every true count in one of the two members' views", func() bool {
		for key, n := range rr.want {
			var counts []string
			for _, p := range []*eos.Processor{h.second, third} {
				if v, ok, err := p.State().Lookup([]byte(key)); err == nil && ok {
					counts = append(counts, string(v))
				}
			}
			if len(counts) != 1 || counts[0] != strconv.Itoa(n) {
				return false
			}
		}
		return h.second.Health().Ready() && third.Health().Ready()
	})
}
