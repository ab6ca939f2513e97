package eos

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/window"
)

// The aggregation handlers alone, over a memory store and its overlay,
// 1,000 keys, a transaction committed every 5,000 records: what a record
// costs between the fetch and the state (go test -bench Handler ./eos).
// make bench measures the processors whole, against Kafka Streams.

func BenchmarkWindowedHandler(b *testing.B) {
	h, err := WindowedCount(window.Tumbling(time.Minute, 10*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	store := state.NewMemory()
	txn := state.NewTxn(store, 0)
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = []byte("k" + strconv.Itoa(i))
	}
	base := time.Now()
	memo := &clockMemo{}  // the partition's stream time, as the processor keeps it
	hs := &handlerState{} // the processor's, shared by its calls
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		// as the runner makes each call's context, its Scope inside
		ctx := withScope(context.Background(), txn, hs, memo)
		r := &kgo.Record{Key: keys[i%1000], Timestamp: base.Add(time.Duration(i) * time.Microsecond)}
		if _, err := h(ctx, r); err != nil {
			b.Fatal(err)
		}
		ctx.keep()
		if i%5000 == 4999 {
			_ = txn.Commit(int64(i))
		}
	}
}

func BenchmarkCountHandler(b *testing.B) {
	h := Count()
	store := state.NewMemory()
	txn := state.NewTxn(store, 0)
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = []byte("k" + strconv.Itoa(i))
	}
	hs := &handlerState{} // the processor's, shared by its calls
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		// as the runner makes each call's context, its Scope inside
		ctx := withScope(context.Background(), txn, hs, nil)
		r := &kgo.Record{Key: keys[i%1000]}
		if _, err := h(ctx, r); err != nil {
			b.Fatal(err)
		}
		ctx.keep()
		if i%5000 == 4999 {
			_ = txn.Commit(int64(i))
		}
	}
}

// BenchmarkWindowSweep is one sweep (the read of every key a window's
// close or expiry point triggers, see sweep) over a committed store of
// 1,000 keys' windows, b.N times: what a record that moves stream time
// past such a point pays, by the store's windows (go test -bench Sweep
// ./eos).
func BenchmarkWindowSweep(b *testing.B) {
	for _, windows := range []int{10_000, 100_000} {
		b.Run(strconv.Itoa(windows)+" windows", func(b *testing.B) {
			spec := window.Spec{Size: time.Minute, Advance: time.Minute, Retention: 24 * time.Hour}
			store := state.NewMemory()
			base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
			var ws []state.Write
			for i := range windows {
				key := window.AppendKey(nil, []byte("k"+strconv.Itoa(i%1000)), base.Add(time.Duration(i/1000)*time.Minute))
				ws = append(ws, state.Write{Key: key, Value: []byte("1")})
			}
			if err := store.Apply(ws, state.Checkpoint{Offset: 1}); err != nil {
				b.Fatal(err)
			}
			txn := state.NewTxn(store, 0)
			was, now := base.Add(time.Hour), base.Add(time.Hour+time.Minute)
			b.ReportAllocs()
			for b.Loop() {
				sc := txn.Scope()
				if _, _, err := sweep(sc, spec, was, now, "finals"); err != nil {
					b.Fatal(err)
				}
				sc.Drop()
			}
		})
	}
}

// BenchmarkWindowHeap reports the memory store's heap per window kept by
// a windowed count: 1,000 keys of 2 to 4 bytes, one record per key per
// minute for 100 minutes of event time (100,000 windows, none expired),
// through the handler and committed transactions (go test -run '^$'
// -bench WindowHeap ./eos).
func BenchmarkWindowHeap(b *testing.B) {
	const keys, minutes = 1000, 100
	h, err := WindowedCount(window.Spec{Size: time.Minute, Advance: time.Minute, Retention: 24 * time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	hs := &handlerState{} // the processor's, shared by its calls
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		store := state.NewMemory()
		txn := state.NewTxn(store, 0)
		memo := &clockMemo{}
		for m := range minutes {
			for k := range keys {
				r := &kgo.Record{Key: []byte("k" + strconv.Itoa(k)), Timestamp: base.Add(time.Duration(m)*time.Minute + time.Duration(k)*time.Millisecond)}
				// as the runner makes each call's context, its Scope inside
				call := withScope(context.Background(), txn, hs, memo)
				if _, err := h(call, r); err != nil {
					b.Fatal(err)
				}
				call.keep()
			}
			if err := txn.Commit(int64(m + 1)); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if n := store.Len(); n != keys*minutes+1 { // and the stream time
			b.Fatalf("%d keys in the store", n)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(keys*minutes), "heapB/window")
		runtime.KeepAlive(store)
	}
}

// BenchmarkJoinTableHandler is JoinTable's handler over a table of 1,000
// keys already in the state, its follower caught up: what joining a
// record costs beyond the join itself.
func BenchmarkJoinTableHandler(b *testing.B) {
	t := NewTable("table")
	f := &tableFollower{topic: "table", keys: newTableKeys("table"), wait: time.Second, changed: make(chan struct{}),
		parts: map[int32]*tableBuffer{0: {from: 0, next: 1000, end: 1000, ready: 1000}}}
	hs := handlerState{joins: &joinedTables{followers: map[*Table]*tableFollower{t: f}}}
	h := JoinTable(t, func(_ context.Context, r *kgo.Record, v []byte, ok bool) ([]*kgo.Record, error) {
		return []*kgo.Record{{Topic: "out", Key: r.Key, Value: v}}, nil
	})
	store := state.NewMemory()
	keys := make([][]byte, 1000)
	var writes []state.Write
	for i := range keys {
		keys[i] = []byte("k" + strconv.Itoa(i))
		writes = append(writes, state.Write{Key: newTableKeys("table").value(keys[i]), Value: make([]byte, 100)})
	}
	writes = append(writes, state.Write{Key: tablePositionKey("table"), Value: []byte("1000")})
	if err := store.Apply(writes, state.Checkpoint{Offset: 1}); err != nil {
		b.Fatal(err)
	}
	txn := state.NewTxn(store, 0)
	now := time.Now()
	memo := &clockMemo{} // the partition's, as the processor keeps it
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		// as the runner makes each call's context, its Scope inside
		ctx := withScope(context.Background(), txn, &hs, memo)
		r := &kgo.Record{Key: keys[i%1000], Timestamp: now}
		if _, err := h(ctx, r); err != nil {
			b.Fatal(err)
		}
		ctx.keep()
		if i%5000 == 4999 {
			_ = txn.Commit(int64(i))
		}
	}
}
