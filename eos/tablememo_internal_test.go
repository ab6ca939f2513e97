package eos

import (
	"bytes"
	"context"
	"errors"
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
// the failed call applied, and join with the value before it.
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

	// join handles a record at t0 plus at as the runner does: its writes
	// kept with its outputs, dropped when it failed.
	join := func(at time.Duration, value string) (string, error) {
		t.Helper()
		call := withScope(context.Background(), ps.txn, &hs, &ps.clock)
		outs, err := h(call, &kgo.Record{Key: []byte("r"), Value: []byte(value), Timestamp: t0.Add(at)})
		if err != nil {
			call.drop()
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

	want(time.Second, "north", 1)
	// This record applies the update at t0+10s, then fails.
	if _, err := join(20*time.Second, "fail"); !errors.Is(err, errJoin) {
		t.Fatalf("the failing record: %v", err)
	}
	want(5*time.Second, "north", 1)
	want(20*time.Second, "NORTH", 1) // the update, applied again
	want(30*time.Second, "NORTH", 1)

	// An abort drops the transaction's writes and the memo with them:
	// the next record reads the committed position (none) again.
	ps.abort()
	want(2*time.Second, "north", 2)
	want(20*time.Second, "NORTH", 2)

	// Committed, the position is the store's, and the memo still holds it.
	if err := ps.txn.Commit(1); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := store.Store.Get(tablePositionKey("regions")); string(v) != "2" {
		t.Fatalf("the committed position %q, want 2", v)
	}
	want(40*time.Second, "NORTH", 2)
}
