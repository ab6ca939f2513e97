package state_test

import (
	"errors"
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
