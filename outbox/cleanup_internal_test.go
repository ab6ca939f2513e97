package outbox

import (
	"maps"
	"testing"
)

// A transaction is visible to a snapshot once it ended before it: below
// xmin, or below xmax and not in progress; at or past xmax it is not,
// across the 32-bit wrap of the log's xids too.
func TestSnapshotVisibility(t *testing.T) {
	epoch := uint64(3) << 32
	snap, err := parseSnapshot("12884901988:12884902000:12884901990,12884901995") // epoch 3: 100:112:102,107
	if err != nil {
		t.Fatal(err)
	}
	for xid, want := range map[uint32]bool{99: true, 100: true, 101: true, 102: false, 107: false, 111: true, 112: false, 200: false} {
		if got := snap.visible(xid); got != want {
			t.Errorf("xid %d visible to %+v: %v, want %v", xid, snap, got, want)
		}
	}
	// xmax just past a wrap: an xid near 2^32 is of the epoch before.
	wrapped := snapshot{xmin: epoch + 5, xmax: epoch + 10, xip: map[uint32]bool{}}
	if !wrapped.visible(0xfffffff0) || wrapped.visible(10) || !wrapped.visible(7) {
		t.Errorf("across the wrap: %v %v %v; want true false true", wrapped.visible(0xfffffff0), wrapped.visible(10), wrapped.visible(7))
	}
}

// The rows a position record carries come back as they were: ranges per
// transaction, interleaved ids included.
func TestCarriedRowsRoundTrip(t *testing.T) {
	ids := map[int64]uint32{}
	for id := int64(1); id <= 30000; id++ {
		ids[id] = 7
	}
	for id := int64(30001); id <= 30100; id++ {
		ids[id] = uint32(8 + id%2) // two transactions' ids interleaved
	}
	carried, dropped := encodeCarried(ids)
	if dropped != 0 || len(carried) != 3 || len(carried[0].IDs) != 1 {
		t.Fatalf("encoded %d transactions (%d dropped), the first in %d ranges; want 3, 0, 1", len(carried), dropped, len(carried[0].IDs))
	}
	back := map[int64]uint32{}
	decodeCarried(carried, back)
	if !maps.Equal(ids, back) {
		t.Fatalf("decoded %d ids, not the %d encoded", len(back), len(ids))
	}
}
