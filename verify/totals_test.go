package verify_test

import (
	"fmt"

	"github.com/eoskit/eoskit/verify"
)

// A feed counted reports per region; one batch of north's was applied
// twice, and one of south's reports never arrived.
func ExampleCheckTotals() {
	want := map[string]int64{"north": 1000, "south": 1000, "east": 1000}
	got := map[string]int64{"north": 1100, "south": 999, "east": 1000}
	fmt.Println(verify.CheckTotals(want, got))
	fmt.Println(verify.CheckTotals(want, want))
	// Output:
	// verify: 2 of 3 totals differ: north: 1100, want 1000 (100 over); south: 999, want 1000 (1 short)
	// <nil>
}
