package eos

import (
	"context"
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
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sc := txn.Scope()
		ctx := withKV(context.Background(), sc, handlerState{})
		r := &kgo.Record{Key: keys[i%1000], Timestamp: base.Add(time.Duration(i) * time.Microsecond)}
		if _, err := h(ctx, r); err != nil {
			b.Fatal(err)
		}
		sc.Keep()
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
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		sc := txn.Scope()
		ctx := withKV(context.Background(), sc, handlerState{})
		r := &kgo.Record{Key: keys[i%1000]}
		if _, err := h(ctx, r); err != nil {
			b.Fatal(err)
		}
		sc.Keep()
		if i%5000 == 4999 {
			_ = txn.Commit(int64(i))
		}
	}
}
