package eos

import (
	"context"
	"testing"
	"time"

	"github.com/eoskit/eoskit/state"
)

// putCounter counts the writes through a KV.
type putCounter struct {
	state.KV
	puts int
}

func (c *putCounter) Put(k, v []byte) error { c.puts++; return c.KV.Put(k, v) }

// The stream time moves by whole milliseconds, the precision it is kept
// in: a later time within the same millisecond, an equal one and an
// earlier one move nothing and write nothing; the next millisecond moves
// it and writes it once.
func TestStreamTimeMovesAndIsWrittenByTheMillisecond(t *testing.T) {
	kv := &putCounter{KV: state.NewTxn(state.NewMemory(), 0)}
	base := time.UnixMilli(1_700_000_000_123).Add(400 * time.Microsecond)
	clock := newStreamClock() // one for every record, as a handler's
	for _, step := range []struct {
		at       time.Time
		was, now time.Time
		puts     int
	}{
		{base, time.Time{}, base.Truncate(time.Millisecond), 1}, // the partition's first record
		{base.Add(300 * time.Microsecond), base.Truncate(time.Millisecond), base.Truncate(time.Millisecond), 1},
		{base, base.Truncate(time.Millisecond), base.Truncate(time.Millisecond), 1},
		{base.Add(-time.Second), base.Truncate(time.Millisecond), base.Truncate(time.Millisecond), 1},
		{base.Add(700 * time.Microsecond), base.Truncate(time.Millisecond), base.Truncate(time.Millisecond).Add(time.Millisecond), 2},
	} {
		was, now, err := clock.move(nil, kv, step.at)
		if err != nil {
			t.Fatal(err)
		}
		if !was.Equal(step.was) || !now.Equal(step.now) || kv.puts != step.puts {
			t.Fatalf("at %s: was %s, now %s, %d writes; want was %s, now %s, %d writes",
				step.at.Format(time.RFC3339Nano), was.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano), kv.puts,
				step.was.Format(time.RFC3339Nano), step.now.Format(time.RFC3339Nano), step.puts)
		}
	}
	if st, err := clock.read(nil, kv); err != nil || !st.Equal(base.Truncate(time.Millisecond).Add(time.Millisecond)) {
		t.Fatalf("the stream time kept: %s, %v", st, err)
	}
	if string(clock) != streamTimeKey {
		t.Fatalf("the clock's key became %q", clock)
	}
}

// getCounter counts the reads through a KV.
type getCounter struct {
	state.KV
	gets int
}

func (c *getCounter) Get(k []byte) ([]byte, bool, error) { c.gets++; return c.KV.Get(k) }

// The processor remembers a partition's stream time between its records
// (clockMemo): a record reads it from the transaction only when nothing
// is remembered; a call's move is remembered once the runner keeps its
// writes, not when they are dropped; an abort forgets it, and the next
// record reads the store's, the transaction's writes gone.
func TestTheStreamTimeIsRememberedAsTheTransactionHasIt(t *testing.T) {
	store := state.NewMemory()
	ps := &partState{store: store, txn: state.NewTxn(store, 0)}
	hs := &handlerState{}
	clock := newStreamClock()
	base := time.UnixMilli(1_700_000_000_000)
	// call handles one record at at as the runner does: keep, or drop,
	// its writes; it returns the stream time the record saw and how many
	// reads of the transaction it made.
	call := func(at time.Time, keep bool) (was time.Time, gets int) {
		t.Helper()
		sc := ps.txn.Scope()
		kv := &getCounter{KV: sc}
		c := withKV(context.Background(), kv, hs, &ps.clock)
		was, _, err := clock.move(handlerStateOf(c).call, kv, at)
		if err != nil {
			t.Fatal(err)
		}
		if keep {
			sc.Keep()
			c.kept()
		} else {
			sc.Drop()
		}
		return was, kv.gets
	}
	check := func(step string, was time.Time, gets int, wantWas time.Time, wantGets int) {
		t.Helper()
		if !was.Equal(wantWas) || gets != wantGets {
			t.Fatalf("%s: saw stream time %v with %d reads; want %v with %d", step, was, gets, wantWas, wantGets)
		}
	}
	was, gets := call(base, true)
	check("the partition's first record", was, gets, time.Time{}, 1)
	was, gets = call(base.Add(time.Second), true)
	check("the next record", was, gets, base, 0)
	was, gets = call(base.Add(time.Hour), false) // fails: dropped
	check("a record that fails", was, gets, base.Add(time.Second), 0)
	was, gets = call(base.Add(2*time.Second), true)
	check("the record after the failed one", was, gets, base.Add(time.Second), 0)
	if err := ps.txn.Commit(1); err != nil {
		t.Fatal(err)
	}
	was, gets = call(base.Add(3*time.Second), true)
	check("the first record after a commit", was, gets, base.Add(2*time.Second), 0)
	ps.abort() // the second transaction aborts: its move to 3 s is gone
	was, gets = call(base.Add(4*time.Second), true)
	check("the first record after an abort", was, gets, base.Add(2*time.Second), 1)
}

// Two aggregations in one handler call (a handler calling both) see the
// call's own move: the second does not move the stream time again from
// where the transaction had it (and so does not close or expire the same
// windows twice).
func TestASecondReadInACallSeesTheCallsMove(t *testing.T) {
	store := state.NewMemory()
	ps := &partState{store: store, txn: state.NewTxn(store, 0)}
	clock := newStreamClock()
	base := time.UnixMilli(1_700_000_000_000)
	sc := ps.txn.Scope()
	c := withKV(context.Background(), sc, &handlerState{}, &ps.clock)
	if _, _, err := clock.move(c, sc, base); err != nil {
		t.Fatal(err)
	}
	was, now, err := clock.move(c, sc, base)
	if err != nil || !was.Equal(base) || !now.Equal(base) {
		t.Fatalf("the second move saw %v to %v (%v), want %v to %v", was, now, err, base, base)
	}
}
