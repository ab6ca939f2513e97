package state_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/eoskit/eoskit/state"
)

// A handler call's writes reach the transaction only when kept: a call
// that failed (dropped) leaves the transaction as it was, while it ran
// it read its own writes over the transaction's.
func TestScopeKeepsOnlyTheWritesOfACallThatSucceeded(t *testing.T) {
	s := state.NewMemory()
	committed(t, s, map[string]string{"a": "1"}, 3)
	tx := state.NewTxn(s, 0)
	must(t, tx.Put([]byte("b"), []byte("2")))

	failed := tx.Scope()
	if _, err := state.Count(failed, []byte("a")); err != nil {
		t.Fatal(err)
	}
	must(t, failed.Delete([]byte("b")))
	if v, ok := get(t, failed, "a"); !ok || v != "2" {
		t.Fatalf("a = %q, %v inside the call: not its own write", v, ok)
	}
	if _, ok := get(t, failed, "b"); ok {
		t.Fatal("b visible inside the call after its delete")
	}
	if v, _ := get(t, tx, "a"); v != "1" {
		t.Fatalf("a = %q in the transaction while the call runs, want 1", v)
	}
	failed.Drop()
	if v, _ := get(t, tx, "a"); v != "1" {
		t.Fatalf("a = %q after a dropped call, want 1", v)
	}
	if v, ok := get(t, tx, "b"); !ok || v != "2" {
		t.Fatalf("b = %q, %v after a dropped call, want 2", v, ok)
	}

	ok := tx.Scope()
	if _, err := state.Count(ok, []byte("a")); err != nil {
		t.Fatal(err)
	}
	must(t, ok.Delete([]byte("b")))
	ok.Keep()
	if v, _ := get(t, tx, "a"); v != "2" {
		t.Fatalf("a = %q after a kept call, want 2", v)
	}
	if _, found := get(t, tx, "b"); found {
		t.Fatal("b still there after a kept delete")
	}
	if d := tx.Dirty(); len(d) != 2 {
		t.Fatalf("dirty %v, want a and b", d)
	}
}

// A write too large for the changelog fails in the call, wrapping
// ErrTooLarge: the record's fault, found before anything is produced.
func TestScopeRefusesAWriteTooLargeForTheChangelog(t *testing.T) {
	tx := state.NewTxn(state.NewMemory(), 200)
	sc := tx.Scope()
	if err := sc.Put([]byte("k"), make([]byte, 150)); !errors.Is(err, state.ErrTooLarge) {
		t.Fatalf("Put of 150 bytes under a 200-byte limit: %v, want ErrTooLarge", err)
	}
	must(t, sc.Put([]byte("k"), make([]byte, 50)))
}

// A call writing many keys (a windowed aggregation deleting its expired
// windows) and some twice reads its own latest write of each and keeps
// each key once, whether the Scope searches its writes or indexes them.
func TestScopeWithManyWritesKeepsEachKeyOnce(t *testing.T) {
	for _, n := range []int{3, 16, 17, 500} {
		s := state.NewMemory()
		tx := state.NewTxn(s, 0)
		sc := tx.Scope()
		for round := range 2 {
			for i := range n {
				key := []byte(fmt.Sprintf("k%d", i))
				switch {
				case round == 1 && i%3 == 0:
					must(t, sc.Delete(key))
				default:
					must(t, sc.Put(key, []byte(fmt.Sprintf("%d-%d", round, i))))
				}
			}
		}
		for i := range n {
			v, ok, err := sc.Get([]byte(fmt.Sprintf("k%d", i)))
			switch {
			case err != nil:
				t.Fatal(err)
			case i%3 == 0 && ok:
				t.Fatalf("n=%d: k%d deleted, reads %q", n, i, v)
			case i%3 != 0 && string(v) != fmt.Sprintf("1-%d", i):
				t.Fatalf("n=%d: k%d reads %q, want its last write", n, i, v)
			}
		}
		sc.Keep()
		if got := tx.Len(); got != n {
			t.Fatalf("n=%d: the transaction holds %d keys, want each once", n, got)
		}
	}
}

// A Scope used again after Keep or Drop starts empty: the kept call's
// writes are the transaction's (a later drop does not take them back),
// and a dropped call's writes are gone.
func TestAScopeUsedAgainStartsEmpty(t *testing.T) {
	tx := state.NewTxn(state.NewMemory(), 0)
	sc := tx.Scope()
	for i := range 4 { // past the writes a Scope holds without a slice of its own
		must(t, sc.Put(fmt.Appendf(nil, "kept%d", i), []byte("1")))
	}
	sc.Keep()
	must(t, sc.Put([]byte("dropped"), []byte("2")))
	must(t, sc.Put([]byte("kept0"), []byte("2")))
	sc.Drop()
	for i := range 4 {
		if v, ok := get(t, sc, fmt.Sprintf("kept%d", i)); !ok || v != "1" {
			t.Fatalf("kept%d = %q, %v after a kept call and a dropped one; want the kept 1", i, v, ok)
		}
	}
	if _, ok := get(t, sc, "dropped"); ok {
		t.Fatal("a dropped write is visible")
	}
	must(t, sc.Put([]byte("last"), []byte("3")))
	sc.Keep()
	if d := tx.Dirty(); len(d) != 5 {
		t.Fatalf("dirty %v, want kept0 to kept3 and last", d)
	}
}

// A read through a Scope allocates only the copy of the value it
// returns, whatever the key's length: a join reads a table's key, of
// more than 32 bytes, for every record.
func TestAScopesReadAllocatesOnlyTheValuesCopy(t *testing.T) {
	m := state.NewMemory()
	key := []byte("\x00eoskit/table/regions-of-the-world\x00region-0042")
	if err := m.Apply([]state.Write{{Key: key, Value: make([]byte, 100)}}, state.Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	sc := state.NewTxn(m, 0).Scope()
	if err := sc.Put([]byte("other"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, ok, err := sc.Get(key); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}); n != 1 {
		t.Fatalf("a read allocated %v times, want 1 (the value's copy)", n)
	}
}
