package outbox

import (
	"bytes"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

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
