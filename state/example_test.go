package state_test

import (
	"fmt"

	"github.com/eoskit/eoskit/state"
)

// A partition's state through two transactions: the first commits, the
// second aborts and leaves no trace. One update per changed key comes out
// of each transaction, whatever the number of inputs.
func Example() {
	store := state.NewMemory() // the committed state of one partition
	tx := state.NewTxn(store, 0)

	// Transaction 1: three clicks, two pages.
	for _, page := range []string{"home", "cart", "home"} {
		n, _ := state.Count(tx, []byte(page)) // what a handler does
		fmt.Printf("%s: %d\n", page, n)       // it reads its own writes
	}
	for _, rec := range state.Updates(tx.Dirty(), "page-counts") {
		fmt.Printf("emit %s=%s\n", rec.Key, rec.Value)
	}
	// The runner produced the changelog records up to offset 1; the
	// transaction committed.
	_ = tx.Commit(2)

	// Transaction 2 aborts.
	_, _ = state.Count(tx, []byte("home"))
	tx.Abort()

	v, _, _ := store.Get([]byte("home"))
	fmt.Printf("committed home=%s at changelog offset %d\n", v, store.Checkpoint().Offset)
	// Output:
	// home: 1
	// cart: 1
	// home: 2
	// emit cart=1
	// emit home=2
	// committed home=2 at changelog offset 2
}
