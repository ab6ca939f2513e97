package eos

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/state"
)

// positionReads counts its store's reads of one key.
type positionReads struct {
	state.Store
	key   []byte
	reads atomic.Int64
}

func (s *positionReads) Get(key []byte) ([]byte, bool, error) {
	if bytes.Equal(key, s.key) {
		s.reads.Add(1)
	}
	return s.Store.Get(key)
}

// A join reads its table's position from the store once, then from the
// partition's memo, which follows what the transaction holds: a call
// that advanced the table and then failed leaves the position where the
// transaction has it (the table's records it applied are dropped with
// it, and applied again by the next record that meets them), and an
// abort makes the next record read the store again. A memo that kept the
// failed call's move would have the next record skip the table's update
// the failed call applied, and join with the value before it. The
// position is committed first, so that every read the memo does not
// answer reaches the store.
func TestAJoinsTablePositionFollowsWhatItsCallsKeep(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	tbl := NewTable("regions")
	f := &tableFollower{topic: "regions", keys: newTableKeys("regions"), wait: time.Second, changed: make(chan struct{}),
		parts: map[int32]*tableBuffer{0: {recs: []*kgo.Record{
			{Key: []byte("r"), Value: []byte("north"), Offset: 0, Timestamp: t0},
			{Key: []byte("r"), Value: []byte("NORTH"), Offset: 1, Timestamp: t0.Add(10 * time.Second)},
		}, from: 0, next: 2, end: 2, ready: 2}}}
	hs := handlerState{joins: &joinedTables{followers: map[*Table]*tableFollower{tbl: f}}}
	errJoin := errors.New("the join failed")
	h := JoinTable(tbl, func(_ context.Context, r *kgo.Record, v []byte, _ bool) ([]*kgo.Record, error) {
		if string(r.Value) == "fail" {
			return nil, errJoin
		}
		return []*kgo.Record{{Topic: "out", Key: r.Key, Value: v}}, nil
	})
	store := &positionReads{Store: state.NewMemory(), key: tablePositionKey("regions")}
	ps := &partState{store: store, txn: state.NewTxn(store, 0)}

	// join handles a record at t0 plus at as the runner does (batch.go):
	// its writes kept with its outputs, dropped when it failed.
	join := func(at time.Duration, value string) (string, error) {
		t.Helper()
		call := withScope(context.Background(), ps.txn, &hs, &ps.clock)
		outs, err := h(call, &kgo.Record{Key: []byte("r"), Value: []byte(value), Timestamp: t0.Add(at)})
		if err != nil {
			call.scope.Drop()
			return "", err
		}
		call.keep()
		return string(outs[0].Value), nil
	}
	want := func(at time.Duration, region string, storeReads int64) {
		t.Helper()
		got, err := join(at, "")
		if err != nil || got != region {
			t.Fatalf("a record at t0+%v joined %q (%v), want %q", at, got, err, region)
		}
		if n := store.reads.Load(); n != storeReads {
			t.Fatalf("after the record at t0+%v: %d reads of the position from the store, want %d", at, n, storeReads)
		}
	}

	want(time.Second, "north", 1) // no position yet: read once
	if err := ps.txn.Commit(1); err != nil {
		t.Fatal(err)
	}
	// As prepare does, the buffer drops what the committed position (1)
	// passed: a memo left behind it asks for a new session.
	b := f.parts[0]
	b.recs, b.from = b.recs[1:], 1
	want(2*time.Second, "north", 1) // the committed position, from the memo
	// This record applies the update at t0+10s, then fails.
	if _, err := join(20*time.Second, "fail"); !errors.Is(err, errJoin) {
		t.Fatalf("the failing record: %v", err)
	}
	want(5*time.Second, "north", 1)
	want(20*time.Second, "NORTH", 1) // the update, applied again
	want(30*time.Second, "NORTH", 1)

	// An abort drops the transaction's writes and the memo with them:
	// the next record reads the committed position (1) again.
	ps.abort()
	want(3*time.Second, "north", 2)
	want(20*time.Second, "NORTH", 2)
}

// Two tables joined in one call each keep their own position in the
// memo; a third, past what the memo holds, reads its position from the
// state every time, and is joined as rightly.
func TestEachTablesPositionIsItsOwn(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	followers := map[*Table]*tableFollower{}
	var tables []*Table
	var stores []*positionReads
	store := state.Store(state.NewMemory())
	for i, topic := range []string{"a", "b", "c"} {
		tbl := NewTable(topic)
		tables = append(tables, tbl)
		recs := []*kgo.Record{
			{Key: []byte("k"), Value: []byte(topic + "1"), Offset: 0, Timestamp: t0},
			{Key: []byte("k"), Value: []byte(topic + "2"), Offset: 1, Timestamp: t0.Add(time.Duration(i+1) * 10 * time.Second)},
		}
		followers[tbl] = &tableFollower{topic: topic, keys: newTableKeys(topic), wait: time.Second, changed: make(chan struct{}), index: i,
			parts: map[int32]*tableBuffer{0: {recs: recs, from: 0, next: 2, end: 2, ready: 2}}}
		counted := &positionReads{Store: store, key: tablePositionKey(topic)}
		stores = append(stores, counted)
		store = counted
	}
	hs := handlerState{joins: &joinedTables{followers: followers}}
	ps := &partState{store: store, txn: state.NewTxn(store, 0)}
	value := func(_ context.Context, _ *kgo.Record, v []byte, _ bool) ([]*kgo.Record, error) {
		return []*kgo.Record{{Topic: "out", Value: v}}, nil
	}
	joins := []HandlerFunc{JoinTable(tables[0], value), JoinTable(tables[1], value), JoinTable(tables[2], value)}
	all := func(at time.Duration) string {
		t.Helper()
		call := withScope(context.Background(), ps.txn, &hs, &ps.clock)
		var got []string
		for _, h := range joins {
			outs, err := h(call, &kgo.Record{Key: []byte("k"), Timestamp: t0.Add(at)})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, string(outs[0].Value))
		}
		call.keep()
		return strings.Join(got, " ")
	}
	for _, step := range []struct {
		at   time.Duration
		want string
	}{{time.Second, "a1 b1 c1"}, {15 * time.Second, "a2 b1 c1"}, {25 * time.Second, "a2 b2 c1"}, {35 * time.Second, "a2 b2 c2"}} {
		if got := all(step.at); got != step.want {
			t.Fatalf("at t0+%v the joins gave %q, want %q", step.at, got, step.want)
		}
		if err := ps.txn.Commit(int64(step.at)); err != nil {
			t.Fatal(err)
		}
	}
	// a and b: one read each, before their first record; c, past the
	// memo: one a record.
	for i, want := range []int64{1, 1, 4} {
		if n := stores[i].reads.Load(); n != want {
			t.Errorf("table %s: %d reads of its position from the store, want %d", []string{"a", "b", "c"}[i], n, want)
		}
	}
}
