package state_test

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/state/pebblestore"
)

// stores runs f on each Store eoskit provides.
func stores(t *testing.T, f func(t *testing.T, open func() state.Store)) {
	t.Run("memory", func(t *testing.T) { f(t, func() state.Store { return state.NewMemory() }) })
	t.Run("pebble", func(t *testing.T) {
		dir := t.TempDir()
		n := 0
		f(t, func() state.Store {
			n++
			s, err := pebblestore.Open(filepath.Join(dir, fmt.Sprint(n)), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		})
	})
}

var topicA = state.TopicID{1}

func get(t *testing.T, r interface {
	Get([]byte) ([]byte, bool, error)
}, key string) (string, bool) {
	t.Helper()
	v, ok, err := r.Get([]byte(key))
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	if ok && v == nil {
		t.Fatalf("Get(%q) = nil, true: a value is never nil", key)
	}
	return string(v), ok
}

func contents(t *testing.T, r state.Reader) map[string]string {
	t.Helper()
	m := map[string]string{}
	if err := r.Range(func(k, v []byte) bool { m[string(k)] = string(v); return true }); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestStoreAppliesWritesInOrderWithTheirCheckpoint(t *testing.T) {
	stores(t, func(t *testing.T, open func() state.Store) {
		s := open()
		if cp := s.Checkpoint(); cp != (state.Checkpoint{}) {
			t.Fatalf("new store at %+v, want zero", cp)
		}
		err := s.Apply([]state.Write{
			{Key: []byte("a"), Value: []byte("1")},
			{Key: []byte("b"), Value: []byte("2")},
			{Key: []byte("a"), Value: []byte("3")}, // later wins
			{Key: []byte("e"), Value: []byte{}},    // empty is a value
			{Key: []byte("b")},                     // nil deletes
		}, state.Checkpoint{TopicID: topicA, Offset: 7})
		if err != nil {
			t.Fatal(err)
		}
		if got := contents(t, s); len(got) != 2 || got["a"] != "3" || got["e"] != "" {
			t.Fatalf("contents %v, want a=3 e=(empty)", got)
		}
		if v, ok := get(t, s, "e"); !ok || v != "" {
			t.Fatalf("empty value: %q, %v", v, ok)
		}
		if _, ok := get(t, s, "b"); ok {
			t.Fatal("deleted key still there")
		}
		if cp := s.Checkpoint(); cp != (state.Checkpoint{TopicID: topicA, Offset: 7}) {
			t.Fatalf("checkpoint %+v", cp)
		}
		// The caller's slices are not kept, and Get's are the caller's.
		k, v := []byte("k"), []byte("v")
		if err := s.Apply([]state.Write{{Key: k, Value: v}}, state.Checkpoint{TopicID: topicA, Offset: 7}); err != nil {
			t.Fatal(err)
		}
		k[0], v[0] = 'x', 'x'
		got, _, _ := s.Get([]byte("k"))
		got[0] = 'y'
		if v, ok := get(t, s, "k"); !ok || v != "v" {
			t.Fatalf("k = %q, %v: the store shares slices", v, ok)
		}
	})
}

func TestStoreRefusesACheckpointBehindOrOfAnotherTopic(t *testing.T) {
	stores(t, func(t *testing.T, open func() state.Store) {
		s := open()
		if err := s.Apply(nil, state.Checkpoint{TopicID: topicA, Offset: 10}); err != nil {
			t.Fatal(err)
		}
		if err := s.Apply([]state.Write{{Key: []byte("a"), Value: []byte("1")}}, state.Checkpoint{TopicID: topicA, Offset: 9}); !errors.Is(err, state.ErrCheckpointBehind) {
			t.Fatalf("apply behind: %v", err)
		}
		if err := s.Apply(nil, state.Checkpoint{TopicID: state.TopicID{2}, Offset: 11}); err == nil {
			t.Fatal("apply for another topic: nil error")
		}
		if _, ok := get(t, s, "a"); ok {
			t.Fatal("a refused Apply wrote")
		}
	})
}

func TestStoreResetDropsEverything(t *testing.T) {
	stores(t, func(t *testing.T, open func() state.Store) {
		s := open()
		if err := s.Apply([]state.Write{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte{0xff}, Value: []byte("2")}, {Key: []byte{}, Value: []byte("3")}},
			state.Checkpoint{TopicID: topicA, Offset: 100}); err != nil {
			t.Fatal(err)
		}
		if got := contents(t, s); len(got) != 3 {
			t.Fatalf("contents %v, want 3 keys (the empty key and 0xff too)", got)
		}
		b := state.Checkpoint{TopicID: state.TopicID{2}, Offset: 0}
		if err := s.Reset(b); err != nil {
			t.Fatal(err)
		}
		if got := contents(t, s); len(got) != 0 {
			t.Fatalf("after Reset: %v", got)
		}
		if cp := s.Checkpoint(); cp != b {
			t.Fatalf("checkpoint %+v after Reset, want %+v", cp, b)
		}
	})
}

func TestStoreFailsAfterClose(t *testing.T) {
	stores(t, func(t *testing.T, open func() state.Store) {
		s := open()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Get([]byte("a")); !errors.Is(err, state.ErrClosed) {
			t.Errorf("Get: %v", err)
		}
		if err := s.Apply(nil, state.Checkpoint{}); !errors.Is(err, state.ErrClosed) {
			t.Errorf("Apply: %v", err)
		}
		if err := s.Range(func(_, _ []byte) bool { return true }); !errors.Is(err, state.ErrClosed) {
			t.Errorf("Range: %v", err)
		}
	})
}

// A reader (an HTTP handler) sees each Apply whole: every key of a batch
// carries the same generation, whatever the interleaving.
func TestStoreReadersSeeEachApplyWhole(t *testing.T) {
	stores(t, func(t *testing.T, open func() state.Store) {
		s := open()
		keys := []string{"a", "b", "c", "d"}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for gen := 1; gen <= 300; gen++ {
				var ws []state.Write
				for _, k := range keys {
					ws = append(ws, state.Write{Key: []byte(k), Value: fmt.Appendf(nil, "%d", gen)})
				}
				if err := s.Apply(ws, state.Checkpoint{TopicID: topicA, Offset: int64(gen)}); err != nil {
					t.Error(err)
					return
				}
			}
			close(stop)
		}()
		for done := false; !done; {
			select {
			case <-stop:
				done = true
			default:
			}
			var vals []string
			if err := s.Range(func(_, v []byte) bool { vals = append(vals, string(v)); return true }); err != nil {
				t.Fatal(err)
			}
			if len(slices.Compact(slices.Clone(slices.Sorted(slices.Values(vals))))) > 1 {
				t.Fatalf("a Range saw two generations: %v", vals)
			}
		}
		wg.Wait()
		if v, _ := get(t, s, "d"); !bytes.Equal([]byte(v), []byte("300")) {
			t.Fatalf("d = %q", v)
		}
	})
}
