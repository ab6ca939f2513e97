package verify_test

import (
	"maps"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/verify"
)

// A key counts from nothing when it comes back after its TTL of its
// partition's stream time, a record out of order renews its key at that
// stream time, and at the end a key is live, expired past the margin, or
// undecided.
func TestCountWithTTLFollowsEachPartitionsStreamTime(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var off int64
	rec := func(p int32, key string, d time.Duration) *kgo.Record {
		off++
		return &kgo.Record{Partition: p, Offset: off, Key: []byte(key), Timestamp: t0.Add(d)}
	}
	tc := verify.CountWithTTL([]*kgo.Record{
		rec(0, "a", 0),
		rec(0, "b", 10*time.Second),
		rec(0, "b", 0),              // out of order: stamped at 10 s
		rec(0, "a", 70*time.Second), // a idle 70 s: counts from nothing
		rec(0, "b", 71*time.Second), // b idle 61 s: too
		rec(0, "c", 75*time.Second),
		rec(1, "d", 0),               // partition 1 stays at 0 s: d lives
		rec(0, "e", 16*time.Second),  // out of order, stamped 75 s
		rec(0, "x", 200*time.Second), // a, b, c and e expired
	}, time.Minute, 10*time.Second)
	if want := map[string]int64{"d": 1, "x": 1}; !maps.Equal(tc.Counts, want) {
		t.Fatalf("counts %v, want %v", tc.Counts, want)
	}
	if len(tc.Expired) != 4 || tc.Undecided != 0 {
		t.Fatalf("expired %v, undecided %d; want a, b, c and e", tc.Expired, tc.Undecided)
	}
	tc = verify.CountWithTTL([]*kgo.Record{rec(0, "a", 0), rec(0, "b", 65*time.Second), rec(0, "b", 69*time.Second)}, time.Minute, 10*time.Second)
	if want := map[string]int64{"b": 2}; !maps.Equal(tc.Counts, want) || len(tc.Expired) != 0 || tc.Undecided != 1 {
		t.Fatalf("counts %v, expired %v, undecided %d; want b live (2), a undecided (expired 9 s ago, under the margin)", tc.Counts, tc.Expired, tc.Undecided)
	}
}
