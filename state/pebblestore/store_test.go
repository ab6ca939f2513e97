package pebblestore_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/state/pebblestore"
)

// A store reopened finds its keys and the checkpoint of its last Apply:
// a restart restores only the changelog past it.
func TestPebbleKeepsItsCheckpointAcrossReopen(t *testing.T) {
	root := t.TempDir()
	open := pebblestore.Factory(root, nil)
	s, err := open("orders-changelog", 3)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "orders-changelog", "3"); s.(*pebblestore.Store).Dir() != want {
		t.Fatalf("dir %s, want %s", s.(*pebblestore.Store).Dir(), want)
	}
	for i := range 100 {
		ws := []state.Write{{Key: fmt.Appendf(nil, "k%03d", i), Value: fmt.Appendf(nil, "v%d", i)}}
		if i%10 == 9 {
			ws = append(ws, state.Write{Key: fmt.Appendf(nil, "k%03d", i-1)}) // a tombstone
		}
		if err := s.Apply(ws, state.Checkpoint{TopicID: topicA, Offset: int64(2*i + 2)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = open("orders-changelog", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if cp := s.Checkpoint(); cp != (state.Checkpoint{TopicID: topicA, Offset: 200}) {
		t.Fatalf("checkpoint after reopen %+v, want offset 200 of topic A", cp)
	}
	got := contents(t, s)
	if len(got) != 90 || got["k099"] != "v99" {
		t.Fatalf("%d keys after reopen (k099=%q), want 90", len(got), got["k099"])
	}
	if _, ok := got["k098"]; ok {
		t.Fatal("a deleted key came back")
	}
	// Another partition is another directory, empty.
	o, err := open("orders-changelog", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if cp := o.Checkpoint(); cp != (state.Checkpoint{}) || len(contents(t, o)) != 0 {
		t.Fatalf("partition 4 is not empty: %+v", cp)
	}
}

// Range goes in key order, and never shows the checkpoint.
func TestPebbleRangesInKeyOrder(t *testing.T) {
	s, err := pebblestore.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Apply([]state.Write{{Key: []byte("b"), Value: []byte("2")}, {Key: []byte("a"), Value: []byte("1")}, {Key: []byte{0}, Value: []byte("0")}},
		state.Checkpoint{TopicID: topicA, Offset: 3}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := s.Range(func(k, _ []byte) bool { keys = append(keys, string(k)); return true }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(keys) != fmt.Sprint([]string{"\x00", "a", "b"}) {
		t.Fatalf("keys %q", keys)
	}
}

// A reset survives a reopen: the old topic's keys never come back.
func TestPebbleResetSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := pebblestore.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply([]state.Write{{Key: []byte("old"), Value: []byte("1")}}, state.Checkpoint{TopicID: topicA, Offset: 50}); err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(state.Checkpoint{TopicID: state.TopicID{2}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = pebblestore.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if cp := s.Checkpoint(); cp != (state.Checkpoint{TopicID: state.TopicID{2}}) || len(contents(t, s)) != 0 {
		t.Fatalf("after reset and reopen: %+v, %v", cp, contents(t, s))
	}
}

// Two processes never share a store: pebble locks its directory.
func TestPebbleRefusesASecondOpen(t *testing.T) {
	dir := t.TempDir()
	s, err := pebblestore.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if o, err := pebblestore.Open(dir, nil); err == nil {
		o.Close()
		t.Fatal("a second open of one directory succeeded")
	}
}

// A checkpoint this version cannot read is refused, not taken for zero.
func TestPebbleRefusesACheckpointItCannotRead(t *testing.T) {
	dir := t.TempDir()
	s, err := pebblestore.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(nil, state.Checkpoint{TopicID: topicA, Offset: 1}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := pebblestore.CorruptCheckpointForTest(dir); err != nil {
		t.Fatal(err)
	}
	if o, err := pebblestore.Open(dir, nil); err == nil {
		o.Close()
		t.Fatal("opened a store whose checkpoint is of an unknown version")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}

var topicA = state.TopicID{1}

func contents(t *testing.T, r state.Reader) map[string]string {
	t.Helper()
	m := map[string]string{}
	if err := r.Range(func(k, v []byte) bool { m[string(k)] = string(v); return true }); err != nil {
		t.Fatal(err)
	}
	return m
}

// A store's directories, each one Factory creates on the way included,
// are its owner's alone (0700): the state is the application's records.
// Before, they were created 0755 (issue 47 item 17, failing on 411f3b1).
func TestPebbleDirectoriesAreTheOwnersAlone(t *testing.T) {
	root := filepath.Join(t.TempDir(), "state")
	s, err := pebblestore.Factory(root, nil)("orders", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, dir := range []string{root, filepath.Join(root, "orders"), pebblestore.Dir(root, "orders", 3)} {
		info, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if perm := info.Mode().Perm(); perm != 0o700 {
			t.Errorf("%s is %o, want 0700", dir, perm)
		}
	}
}

// Scan reads a range in key order, as state.Scan does over any store.
func TestPebbleScansARange(t *testing.T) {
	s, err := pebblestore.Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var writes []state.Write
	for _, k := range []string{"b", "a", "ab", "abc", "b\xff", "c", "\xff\xff"} {
		writes = append(writes, state.Write{Key: []byte(k), Value: []byte("v" + k)})
	}
	if err := s.Apply(writes, state.Checkpoint{TopicID: topicA, Offset: 7}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		start, end []byte
		want       []string
	}{
		{nil, nil, []string{"a", "ab", "abc", "b", "b\xff", "c", "\xff\xff"}},
		{[]byte("ab"), []byte("b"), []string{"ab", "abc"}},
		{[]byte("a"), state.PrefixEnd([]byte("a")), []string{"a", "ab", "abc"}},
		{[]byte("\xff"), state.PrefixEnd([]byte("\xff")), []string{"\xff\xff"}},
		{[]byte("c"), []byte("a"), nil},
	} {
		var got []string
		if err := state.Scan(s, c.start, c.end, func(k, v []byte) bool {
			if string(v) != "v"+string(k) {
				t.Errorf("key %q with value %q", k, v)
			}
			got = append(got, string(k))
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Scan(%q, %q) = %q, want %q", c.start, c.end, got, c.want)
		}
	}
}
