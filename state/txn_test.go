package state_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/eoskit/eoskit/state"
)

func committed(t *testing.T, s state.Store, kv map[string]string, offset int64) {
	t.Helper()
	var ws []state.Write
	for k, v := range kv {
		ws = append(ws, state.Write{Key: []byte(k), Value: []byte(v)})
	}
	if err := s.Apply(ws, state.Checkpoint{TopicID: topicA, Offset: offset}); err != nil {
		t.Fatal(err)
	}
}

func TestTxnReadsItsOwnWritesOverTheStore(t *testing.T) {
	stores(t, func(t *testing.T, open func() state.Store) {
		s := open()
		committed(t, s, map[string]string{"a": "1", "b": "2"}, 5)
		tx := state.NewTxn(s, 0)
		if v, ok := get(t, tx, "a"); !ok || v != "1" {
			t.Fatalf("a = %q, %v: the store's value", v, ok)
		}
		must(t, tx.Put([]byte("a"), []byte("10")))
		must(t, tx.Delete([]byte("b")))
		must(t, tx.Put([]byte("c"), nil)) // an empty value, not a delete
		if v, ok := get(t, tx, "a"); !ok || v != "10" {
			t.Fatalf("a = %q, %v: not its own write", v, ok)
		}
		if _, ok := get(t, tx, "b"); ok {
			t.Fatal("b visible after its delete")
		}
		if v, ok := get(t, tx, "c"); !ok || v != "" {
			t.Fatalf("c = %q, %v", v, ok)
		}
		// The store, and so every reader of committed state, sees none of it.
		if v, _ := get(t, s, "a"); v != "1" {
			t.Fatalf("store's a = %q before commit", v)
		}
		if _, ok := get(t, s, "c"); ok {
			t.Fatal("store has c before commit")
		}
	})
}

func TestTxnAbortLeavesNothingBehind(t *testing.T) {
	stores(t, func(t *testing.T, open func() state.Store) {
		s := open()
		committed(t, s, map[string]string{"a": "1", "b": "2"}, 5)
		tx := state.NewTxn(s, 0)
		must(t, tx.Put([]byte("a"), []byte("x")))
		must(t, tx.Put([]byte("z"), []byte("x")))
		must(t, tx.Delete([]byte("b")))
		tx.Abort()
		if got := contents(t, s); len(got) != 2 || got["a"] != "1" || got["b"] != "2" {
			t.Fatalf("store after abort: %v", got)
		}
		if s.Checkpoint().Offset != 5 {
			t.Fatalf("checkpoint moved: %+v", s.Checkpoint())
		}
		if v, _ := get(t, tx, "a"); v != "1" {
			t.Fatalf("a = %q through the txn after abort", v)
		}
		if _, ok := get(t, tx, "z"); ok {
			t.Fatal("z visible through the txn after abort")
		}
		if v, _ := get(t, tx, "b"); v != "2" {
			t.Fatalf("b = %q through the txn after abort", v)
		}
		if d := tx.Dirty(); len(d) != 0 {
			t.Fatalf("dirty after abort: %v", d)
		}
		// The next transaction commits only its own writes.
		must(t, tx.Put([]byte("c"), []byte("3")))
		must(t, tx.Commit(9))
		if got := contents(t, s); len(got) != 3 || got["a"] != "1" || got["c"] != "3" {
			t.Fatalf("store after the next commit: %v", got)
		}
	})
}

func TestTxnCommitAppliesTheFinalValueOfEachKeyOnce(t *testing.T) {
	stores(t, func(t *testing.T, open func() state.Store) {
		s := open()
		committed(t, s, map[string]string{"gone": "1", "kept": "2"}, 3)
		tx := state.NewTxn(s, 0)
		must(t, tx.Put([]byte("b"), []byte("1")))
		must(t, tx.Put([]byte("a"), []byte("1")))
		must(t, tx.Put([]byte("b"), []byte("2")))
		must(t, tx.Delete([]byte("gone")))
		must(t, tx.Put([]byte("tmp"), []byte("1")))
		must(t, tx.Delete([]byte("tmp"))) // a tombstone all the same: the store may have had it
		want := "a=1 b=2 gone=<nil> tmp=<nil>"
		if got := show(tx.Dirty()); got != want {
			t.Fatalf("Dirty() = %s, want %s", got, want)
		}
		must(t, tx.Commit(11))
		if cp := s.Checkpoint(); cp != (state.Checkpoint{TopicID: topicA, Offset: 11}) {
			t.Fatalf("checkpoint %+v", cp)
		}
		if got := contents(t, s); len(got) != 3 || got["a"] != "1" || got["b"] != "2" || got["kept"] != "2" {
			t.Fatalf("store %v", got)
		}
		if tx.Len() != 0 {
			t.Fatal("the next transaction does not start empty")
		}
		must(t, tx.Commit(12)) // nothing written: nothing applied
		if s.Checkpoint().Offset != 11 {
			t.Fatalf("an empty commit moved the checkpoint: %+v", s.Checkpoint())
		}
	})
}

type failingStore struct {
	state.Store
	fail bool
}

func (f *failingStore) Apply(ws []state.Write, cp state.Checkpoint) error {
	if f.fail {
		return errors.New("disk full")
	}
	return f.Store.Apply(ws, cp)
}

// A store that fails keeps the transaction's writes for another Commit.
func TestTxnCommitKeepsTheWritesWhenTheStoreFails(t *testing.T) {
	fs := &failingStore{Store: state.NewMemory(), fail: true}
	tx := state.NewTxn(fs, 0)
	must(t, tx.Put([]byte("a"), []byte("1")))
	if err := tx.Commit(4); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Commit: %v", err)
	}
	fs.fail = false
	must(t, tx.Commit(4))
	if v, _ := get(t, fs, "a"); v != "1" {
		t.Fatalf("a = %q", v)
	}
}

func TestTxnRefusesARecordTooLargeForTheChangelog(t *testing.T) {
	tx := state.NewTxn(state.NewMemory(), 1000)
	must(t, tx.Put(make([]byte, 10), make([]byte, 1000-10-state.RecordOverhead)))
	err := tx.Put(make([]byte, 10), make([]byte, 1000-10-state.RecordOverhead+1))
	if !errors.Is(err, state.ErrTooLarge) {
		t.Fatalf("Put over the limit: %v", err)
	}
	if err := tx.Delete(make([]byte, 1000)); !errors.Is(err, state.ErrTooLarge) {
		t.Fatalf("Delete of a key over the limit: %v", err)
	}
	if tx.Len() != 1 {
		t.Fatalf("%d keys dirty, want the one that fits", tx.Len())
	}
}

// Lanes write their own keys at once, each reading its own writes, while
// an HTTP handler reads committed state: run with -race.
func TestTxnIsSafeForConcurrentLanes(t *testing.T) {
	stores(t, func(t *testing.T, open func() state.Store) {
		s := open()
		tx := state.NewTxn(s, 0)
		const lanes, per = 8, 200
		var wg sync.WaitGroup
		stop, stopped := make(chan struct{}), make(chan struct{})
		go func() { // a reader of committed state
			defer close(stopped)
			for {
				select {
				case <-stop:
					return
				default:
					if _, ok := get(t, s, "lane0-0"); ok {
						t.Error("a reader saw an uncommitted write")
						return
					}
				}
			}
		}()
		for l := range lanes {
			wg.Go(func() {
				for i := range per {
					key := fmt.Appendf(nil, "lane%d-%d", l, i%20)
					if _, err := state.Count(tx, key); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(stop)
		<-stopped
		d := tx.Dirty()
		if len(d) != lanes*20 {
			t.Fatalf("%d keys dirty, want %d", len(d), lanes*20)
		}
		for _, w := range d {
			if string(w.Value) != fmt.Sprint(per/20) {
				t.Fatalf("%s = %s, want %d", w.Key, w.Value, per/20)
			}
		}
		must(t, tx.Commit(1))
		if v, _ := get(t, s, "lane7-19"); v != "10" {
			t.Fatalf("committed lane7-19 = %q", v)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func show(ws []state.Write) string {
	var parts []string
	for _, w := range ws {
		v := string(w.Value)
		if w.Value == nil {
			v = "<nil>"
		}
		parts = append(parts, string(w.Key)+"="+v)
	}
	return strings.Join(parts, " ")
}
