package eos

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/window"
)

// sweepCounter counts a windowed aggregation's sweeps: its reads of every
// key of the store.
type sweepCounter struct {
	*state.Scope
	sweeps *int
}

func (c sweepCounter) Keys(fn func(key []byte) bool) error {
	*c.sweeps++
	return c.Scope.Keys(fn)
}

// boundRun handles records of one key through a windowed count as the
// processor does (a Scope a call, kept or dropped, the partition's memo),
// counting the sweeps.
type boundRun struct {
	t      *testing.T
	h      HandlerFunc
	ps     *partState
	memo   *clockMemo // nil: none, as outside a processor
	sweeps int
}

func newBoundRun(t *testing.T, spec window.Spec, memo bool) *boundRun {
	h, err := WindowedCount(spec)
	if err != nil {
		t.Fatal(err)
	}
	store := state.NewMemory()
	run := &boundRun{t: t, h: h, ps: &partState{store: store, txn: state.NewTxn(store, 0)}}
	if memo {
		run.memo = &run.ps.clock
	}
	return run
}

// record handles a record at at; keep false drops its writes (it failed).
func (b *boundRun) record(at time.Time, keep bool) {
	b.t.Helper()
	sc := b.ps.txn.Scope()
	call := withKV(context.Background(), sweepCounter{Scope: sc, sweeps: &b.sweeps}, &handlerState{}, b.memo)
	if _, err := b.h(call, &kgo.Record{Key: []byte("k"), Timestamp: at}); err != nil {
		b.t.Fatal(err)
	}
	if keep {
		sc.Keep()
		call.kept()
	} else {
		sc.Drop()
	}
}

// windows lists the window starts the transaction holds, as minutes
// since base.
func (b *boundRun) windows(base time.Time) []int {
	b.t.Helper()
	var ms []int
	err := forWindows(b.ps.txn.Scope(), window.Tumbling(time.Minute, 0), func(_ []byte, w window.Window) {
		ms = append(ms, int(w.Start.Sub(base)/time.Minute))
	})
	if err != nil {
		b.t.Fatal(err)
	}
	return ms
}

// With windows kept an hour, the store's earliest window (a lower bound
// of the starts, kept per partition) shows that nothing can expire for
// the hour's first 59 expiry points: the sweep reads the store once, at
// the partition's first record, then not again until the earliest window
// expires, when it deletes it. Without the bound (the negative control)
// it reads the store at every minute of stream time.
func TestTheSweepIsLeftOutWhileNoWindowCanHaveExpired(t *testing.T) {
	spec := window.Tumbling(time.Minute, 0)
	spec.Retention = time.Hour
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		memo       bool
		sweepsTo59 int
	}{{true, 1}, {false, 60}} {
		run := newBoundRun(t, spec, c.memo)
		for m := range 60 {
			run.record(base.Add(time.Duration(m)*time.Minute+time.Second), true)
		}
		if run.sweeps != c.sweepsTo59 {
			t.Fatalf("memo %v: %d sweeps over minutes 0-59, want %d", c.memo, run.sweeps, c.sweepsTo59)
		}
		run.record(base.Add(60*time.Minute+time.Second), true) // window 0 expires
		if run.sweeps != c.sweepsTo59+1 {
			t.Fatalf("memo %v: %d sweeps, want one more when the first window expires", c.memo, run.sweeps)
		}
		if ws := run.windows(base); len(ws) != 60 || slices.Contains(ws, 0) {
			t.Fatalf("memo %v: the store holds windows %v, want minutes 1-60", c.memo, ws)
		}
		run.record(base.Add(61*time.Minute+time.Second), true) // window 1 expires
		if ws := run.windows(base); slices.Contains(ws, 1) {
			t.Fatalf("memo %v: window 1 kept past its retention: %v", c.memo, ws)
		}
	}
}

// A call that swept but was dropped (its record failed) leaves the bound
// as it was: its deletions are gone, and the window it deleted must
// still expire at the next point. An abort forgets the bound: the next
// expiry point sweeps.
func TestTheSweepsBoundFollowsTheTransaction(t *testing.T) {
	spec := window.Tumbling(time.Minute, 0)
	spec.Retention = 10 * time.Minute
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	run := newBoundRun(t, spec, true)
	for m := range 10 {
		run.record(base.Add(time.Duration(m)*time.Minute), true)
	}
	run.record(base.Add(10*time.Minute), false) // sweeps window 0 away, dropped
	if ws := run.windows(base); !slices.Contains(ws, 0) {
		t.Fatalf("a dropped call's deletion stayed: %v", ws)
	}
	before := run.sweeps
	run.record(base.Add(10*time.Minute+time.Second), true) // the point again: sweeps, kept
	if run.sweeps != before+1 || slices.Contains(run.windows(base), 0) {
		t.Fatalf("after a dropped sweep: %d sweeps (want %d), windows %v (want window 0 gone)", run.sweeps, before+1, run.windows(base))
	}
	if err := run.ps.txn.Commit(1); err != nil {
		t.Fatal(err)
	}
	run.record(base.Add(11*time.Minute), true) // sweeps window 1 away in the next transaction
	run.ps.abort()                             // which aborts: window 1 is back
	before = run.sweeps
	run.record(base.Add(11*time.Minute+time.Second), true)
	if run.sweeps != before+1 || slices.Contains(run.windows(base), 1) {
		t.Fatalf("after an abort: %d sweeps (want %d), windows %v (want window 1 gone)", run.sweeps, before+1, run.windows(base))
	}
}
