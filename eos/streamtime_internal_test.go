package eos

import (
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
		was, now, err := clock.move(kv, step.at)
		if err != nil {
			t.Fatal(err)
		}
		if !was.Equal(step.was) || !now.Equal(step.now) || kv.puts != step.puts {
			t.Fatalf("at %s: was %s, now %s, %d writes; want was %s, now %s, %d writes",
				step.at.Format(time.RFC3339Nano), was.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano), kv.puts,
				step.was.Format(time.RFC3339Nano), step.now.Format(time.RFC3339Nano), step.puts)
		}
	}
	if st, err := clock.read(kv); err != nil || !st.Equal(base.Truncate(time.Millisecond).Add(time.Millisecond)) {
		t.Fatalf("the stream time kept: %s, %v", st, err)
	}
	if string(clock) != streamTimeKey {
		t.Fatalf("the clock's key became %q", clock)
	}
}
