package state_test

import (
	"slices"
	"testing"

	"github.com/eoskit/eoskit/state"
)

// A Scope lists the keys it sees: the store's, less what the transaction
// or the call deleted, with what they wrote; once each.
func TestScopeKeysAreWhatItSees(t *testing.T) {
	store := state.NewMemory()
	if err := store.Apply([]state.Write{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: []byte("1")}, {Key: []byte("c"), Value: []byte("1")}},
		state.Checkpoint{Offset: 3}); err != nil {
		t.Fatal(err)
	}
	txn := state.NewTxn(store, 0)
	earlier := txn.Scope()
	_ = earlier.Delete([]byte("b"))
	_ = earlier.Put([]byte("d"), []byte("1"))
	earlier.Keep()
	call := txn.Scope()
	_ = call.Delete([]byte("c"))
	_ = call.Put([]byte("e"), []byte("1"))
	_ = call.Put([]byte("a"), []byte("2"))
	var keys []string
	if err := call.Keys(func(k []byte) bool { keys = append(keys, string(k)); return true }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	if want := []string{"a", "d", "e"}; !slices.Equal(keys, want) {
		t.Fatalf("keys %q, want %q", keys, want)
	}
	n := 0
	_ = call.Keys(func([]byte) bool { n++; return false })
	if n != 1 {
		t.Fatalf("Keys went on after fn returned false (%d calls)", n)
	}
}

// Reserved keys commit with the state but are not an aggregation's
// updates.
func TestUpdatesLeaveOutReservedKeys(t *testing.T) {
	recs := state.Updates([]state.Write{{Key: []byte(state.ReservedPrefix + "stream-time"), Value: []byte("1")}, {Key: []byte("a"), Value: []byte("2")}}, "updates")
	if len(recs) != 1 || string(recs[0].Key) != "a" {
		t.Fatalf("updates %v", recs)
	}
	if !state.IsReserved([]byte(state.ReservedPrefix+"x")) || state.IsReserved([]byte("eoskit:x")) {
		t.Fatal("IsReserved")
	}
}
