package eos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	return newBoundRunOf(t, h, memo)
}

func newBoundRunOf(t *testing.T, h HandlerFunc, memo bool) *boundRun {
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
	if _, err := b.handle(&kgo.Record{Key: []byte("k"), Timestamp: at}, keep); err != nil {
		b.t.Fatal(err)
	}
}

// handle handles r as the runner does: its writes kept (keep, and the
// handler returned nil) or dropped.
func (b *boundRun) handle(r *kgo.Record, keep bool) ([]*kgo.Record, error) {
	sc := b.ps.txn.Scope()
	call := withKV(context.Background(), sweepCounter{Scope: sc, sweeps: &b.sweeps}, &handlerState{}, b.memo)
	outs, err := b.h(call, r)
	if keep && err == nil {
		sc.Keep()
		call.kept()
	} else {
		sc.Drop()
	}
	return outs, err
}

// contents is the transaction's view of the store, reserved keys and
// all, as "key=value" lines in key order.
func (b *boundRun) contents() []string {
	b.t.Helper()
	sc := b.ps.txn.Scope()
	var lines []string
	if err := sc.Keys(func(key []byte) bool {
		v, _, err := sc.Get(key)
		if err != nil {
			b.t.Fatal(err)
		}
		lines = append(lines, fmt.Sprintf("%q=%q", key, v))
		return true
	}); err != nil {
		b.t.Fatal(err)
	}
	slices.Sort(lines)
	return lines
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

// The bound only leaves out sweeps that would change nothing: a run with
// it and one without (the sweep at every expiry point) hold the same
// state, produce the same finals and fail the same records after every
// step of a random history: hopping windows, an aggregate that deletes
// windows, EmitFinal, records out of order and late, failing records
// (dropped calls), commits and aborts.
func TestTheBoundChangesNoOutcome(t *testing.T) {
	spec := window.Hopping(10*time.Minute, 3*time.Minute, time.Minute)
	spec.Retention = 40 * time.Minute
	add := func(agg []byte, r *kgo.Record) ([]byte, error) {
		switch string(r.Value) {
		case "delete":
			return nil, nil // the window leaves the store
		case "fail":
			return nil, errors.New("the record's fault")
		}
		return append(agg, 'x'), nil
	}
	for seed := range uint64(20) {
		h, err := WindowedAggregate(spec, add, EmitFinal("finals"))
		if err != nil {
			t.Fatal(err)
		}
		with, without := newBoundRunOf(t, h, true), newBoundRunOf(t, h, false)
		rng := rand.New(rand.NewPCG(seed, 45))
		base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
		at := base
		for step := range 600 {
			switch n := rng.IntN(100); {
			case n < 2:
				for _, b := range []*boundRun{with, without} {
					b.ps.abort()
				}
			case n < 6:
				for i, b := range []*boundRun{with, without} {
					if err := b.ps.txn.Commit(int64(step)); err != nil {
						t.Fatal(i, err)
					}
				}
			default:
				// Mostly forward, some out of order (late or within grace).
				at = at.Add(time.Duration(rng.IntN(90)-10) * time.Second)
				value := []string{"", "", "", "", "delete", "fail"}[rng.IntN(6)]
				r := &kgo.Record{Key: []byte{byte('a' + rng.IntN(3))}, Value: []byte(value), Timestamp: at}
				keep := rng.IntN(10) > 0
				outs1, err1 := with.handle(r, keep)
				outs2, err2 := without.handle(r, keep)
				if (err1 == nil) != (err2 == nil) || fmt.Sprint(recordsOf(outs1)) != fmt.Sprint(recordsOf(outs2)) {
					t.Fatalf("seed %d step %d: with the bound %v %v, without %v %v", seed, step, recordsOf(outs1), err1, recordsOf(outs2), err2)
				}
			}
			if c1, c2 := with.contents(), without.contents(); !slices.Equal(c1, c2) {
				t.Fatalf("seed %d step %d: the state with the bound\n%v\nwithout\n%v", seed, step, c1, c2)
			}
		}
		if with.sweeps >= without.sweeps {
			t.Fatalf("seed %d: %d sweeps with the bound, %d without: none left out", seed, with.sweeps, without.sweeps)
		}
	}
}

func recordsOf(rs []*kgo.Record) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s %q=%q", r.Topic, r.Key, r.Value))
	}
	return out
}

// A record within grace writes a window earlier than every window the
// store held when the bound was learnt: the bound comes down to it, and
// the window expires at its own point, as without the bound (the
// control). With the bound left where the sweep put it, the window would
// stay four minutes past its retention.
func TestAWindowWrittenBelowTheBoundStillExpires(t *testing.T) {
	spec := window.Tumbling(time.Minute, 10*time.Minute) // retention 11 minutes
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, memo := range []bool{true, false} {
		run := newBoundRun(t, spec, memo)
		run.record(base.Add(25*time.Minute), true)                // the first record sweeps: the bound is window 25
		run.record(base.Add(21*time.Minute+30*time.Second), true) // within grace: window 21, below the bound
		for m := 26; m <= 32; m++ {
			run.record(base.Add(time.Duration(m)*time.Minute), true)
		}
		if ws := run.windows(base); slices.Contains(ws, 21) {
			t.Fatalf("memo %v: at stream time 32:00 the store still holds window 21 (retention 11 minutes): %v", memo, ws)
		}
	}
}

// A sweep that leaves no window (an aggregate deleted them) makes the
// bound "none"; the next window written brings it down to that window,
// which still expires at its point. (A window written and deleted in
// one call lowers the bound too: a lower bound may be low, so the bound
// run sweeps at minutes 0 and 11 here, where the control sweeps at
// each.)
func TestAnEmptyStoresBoundWaitsForTheNextWindow(t *testing.T) {
	spec := window.Tumbling(time.Minute, 0)
	spec.Retention = 10 * time.Minute
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	h, err := WindowedAggregate(spec, func(agg []byte, r *kgo.Record) ([]byte, error) {
		if string(r.Value) == "delete" {
			return nil, nil
		}
		return append(agg, 'x'), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sweeps := map[bool]int{}
	for _, memo := range []bool{true, false} {
		run := newBoundRunOf(t, h, memo)
		handle := func(m int, value string) {
			t.Helper()
			if _, err := run.handle(&kgo.Record{Key: []byte("k"), Value: []byte(value), Timestamp: base.Add(time.Duration(m) * time.Minute)}, true); err != nil {
				t.Fatal(err)
			}
		}
		handle(0, "delete") // the first record sweeps an empty store
		for m := 1; m <= 20; m++ {
			handle(m, "delete")
		}
		sweeps[memo] = run.sweeps
		handle(21, "")
		for m := 22; m <= 31; m++ {
			handle(m, "delete")
		}
		if ws := run.windows(base); slices.Contains(ws, 21) {
			t.Fatalf("memo %v: at stream time 31:00 the store still holds window 21 (retention 10 minutes): %v", memo, ws)
		}
	}
	if sweeps[true] != 2 || sweeps[false] != 21 {
		t.Fatalf("sweeps over minutes 0-20: %d with the bound (want 2), %d without (want 21)", sweeps[true], sweeps[false])
	}
}
