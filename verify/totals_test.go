package verify_test

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

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

// The updates of a count read back: north's count went back after a
// restart that lost its state, and south's 2 was seen twice.
func ExampleLastCounts() {
	var recs []*kgo.Record
	for i, u := range []struct{ key, value string }{{"north", "1"}, {"south", "1"}, {"north", "2"}, {"south", "2"}, {"south", "2"}, {"north", "1"}, {"north", "3"}} {
		recs = append(recs, &kgo.Record{Topic: "updates", Key: []byte(u.key), Value: []byte(u.value), Offset: int64(i)})
	}
	last, notGrowing, err := verify.LastCounts(recs)
	fmt.Println(last, notGrowing, err)
	// Output:
	// map[north:3 south:2] [updates[0]@4 updates[0]@5] <nil>
}
