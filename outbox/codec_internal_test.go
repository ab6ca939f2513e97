package outbox

import (
	"bytes"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Slot names are per server: databases whose names differ only in case or
// in characters a slot name can not hold get slots of their own, and every
// name is valid.
func TestSlotNamesOfDistinctDatabasesDiffer(t *testing.T) {
	names := []string{"app", "App", "a-b", "a_b", "a b", strings.Repeat("x", 63), strings.Repeat("x", 64), "é", "_"}
	seen := map[string]string{}
	for _, db := range names {
		s := slotName(db)
		if !validSlotName(s) {
			t.Errorf("slotName(%q) = %q, not a valid slot name", db, s)
		}
		if other, ok := seen[s]; ok {
			t.Errorf("databases %q and %q share slot %q", other, db, s)
		}
		seen[s] = db
	}
}

// Headers survive the round trip, nil and empty values apart; malformed
// columns (truncated, trailing bytes, absurd counts) are refused, not
// misread.
func TestHeadersCodec(t *testing.T) {
	hs := []kgo.RecordHeader{{Key: "a", Value: nil}, {Key: "b", Value: []byte{}}, {Key: "", Value: []byte{0, 0xff}}}
	b := encodeHeaders(hs)
	got, err := decodeHeaders(b)
	if err != nil || len(got) != 3 || got[0].Value != nil || got[1].Value == nil || len(got[1].Value) != 0 || !bytes.Equal(got[2].Value, []byte{0, 0xff}) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if encodeHeaders(nil) != nil {
		t.Fatal("no headers must be NULL")
	}
	for _, bad := range [][]byte{b[:len(b)-1], append(append([]byte{}, b...), 0), {0xff, 0xff, 0xff, 0xff, 0x0f}, {1, 5, 'a'}} {
		if _, err := decodeHeaders(bad); err == nil {
			t.Errorf("decodeHeaders(%x) accepted a malformed column", bad)
		}
	}
}
