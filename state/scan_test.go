package state_test

import (
	"slices"
	"testing"

	"github.com/eoskit/eoskit/state"
)

func TestScanReadsARangeInKeyOrder(t *testing.T) {
	m := state.NewMemory()
	var writes []state.Write
	for _, k := range []string{"b", "a", "ab", "abc", "b\xff", "c", "\xff\xff"} {
		writes = append(writes, state.Write{Key: []byte(k), Value: []byte("v" + k)})
	}
	if err := m.Apply(writes, state.Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	scan := func(start, end []byte, most int) []string {
		var got []string
		if err := state.Scan(m, start, end, func(k, v []byte) bool {
			if string(v) != "v"+string(k) {
				t.Errorf("key %q with value %q", k, v)
			}
			got = append(got, string(k))
			return len(got) < most
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, c := range []struct {
		start, end []byte
		most       int
		want       []string
	}{
		{nil, nil, 100, []string{"a", "ab", "abc", "b", "b\xff", "c", "\xff\xff"}},
		{[]byte("ab"), []byte("b"), 100, []string{"ab", "abc"}},
		{[]byte("a"), state.PrefixEnd([]byte("a")), 100, []string{"a", "ab", "abc"}},
		{[]byte("b"), state.PrefixEnd([]byte("b")), 100, []string{"b", "b\xff"}},
		{[]byte("\xff"), state.PrefixEnd([]byte("\xff")), 100, []string{"\xff\xff"}},
		{nil, nil, 2, []string{"a", "ab"}},
	} {
		if got := scan(c.start, c.end, c.most); !slices.Equal(got, c.want) {
			t.Errorf("Scan(%q, %q) = %q, want %q", c.start, c.end, got, c.want)
		}
	}
}

func TestPrefixEnd(t *testing.T) {
	for prefix, want := range map[string]string{"a": "b", "ab\xff": "ac", "\xff\xff": "", "": "", "a\x00": "a\x01"} {
		if got := string(state.PrefixEnd([]byte(prefix))); got != want {
			t.Errorf("PrefixEnd(%q) = %q, want %q", prefix, got, want)
		}
	}
	if end := state.PrefixEnd([]byte("\xff")); end != nil {
		t.Errorf("PrefixEnd(0xff) = %q, want nil", end)
	}
}
