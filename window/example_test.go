package window_test

import (
	"fmt"
	"time"

	"github.com/eoskit/eoskit/window"
)

// Cases per region per day, by when each was reported, taking reports up
// to an hour late.
func ExampleTumbling() {
	daily := window.Tumbling(24*time.Hour, time.Hour)
	reported := time.Date(2026, 12, 4, 23, 30, 0, 0, time.UTC)
	w := daily.For(reported)[0]
	fmt.Println("window:", w)

	// Stream time: the latest report seen on the partition.
	for _, streamTime := range []time.Time{
		time.Date(2026, 12, 5, 0, 20, 0, 0, time.UTC),
		time.Date(2026, 12, 5, 1, 0, 0, 0, time.UTC),
	} {
		_, err := daily.Open(reported, streamTime)
		fmt.Printf("at stream time %s: late=%v\n", streamTime.Format("15:04"), err != nil)
	}
	// Output:
	// window: [2026-12-04T00:00:00Z, 2026-12-05T00:00:00Z)
	// at stream time 00:20: late=false
	// at stream time 01:00: late=true
}
