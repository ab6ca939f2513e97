package state_test

import (
	"crypto/rand"
	"fmt"
	"runtime"
	"testing"

	"github.com/eoskit/eoskit/state"
)

// BenchmarkMemoryHeapPerKey reports the in-memory store's heap per key
// for 1,000,000 keys of 10 bytes with 8-byte values (a count's worth):
// go test -run '^$' -bench MemoryHeapPerKey ./state/
func BenchmarkMemoryHeapPerKey(b *testing.B) {
	const keys, batch = 1_000_000, 10_000
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := state.NewMemory()
		ws := make([]state.Write, 0, batch)
		for i := range keys {
			ws = append(ws, state.Write{Key: fmt.Appendf(nil, "key-%06d", i), Value: []byte("12345678")})
			if len(ws) == batch {
				if err := s.Apply(ws, state.Checkpoint{Offset: int64(i + 1)}); err != nil {
					b.Fatal(err)
				}
				ws = ws[:0]
			}
		}
		ws = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		if s.Len() != keys {
			b.Fatalf("%d keys", s.Len())
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/keys, "heapB/key")
		runtime.KeepAlive(s)
	}
}

// BenchmarkMemoryApply reports what applying a restore's records to the
// memory store costs per record: 500,000 keys of 12 bytes with 100-byte
// values, in batches of 60,000 (about one 8 MiB fetch), into an empty
// store: go test -run '^$' -bench MemoryApply ./state/
func BenchmarkMemoryApply(b *testing.B) {
	const keys, batch = 500_000, 60_000
	ws := make([]state.Write, keys)
	for i := range ws {
		v := make([]byte, 100)
		rand.Read(v)
		ws[i] = state.Write{Key: fmt.Appendf(nil, "key-%08d", i), Value: v}
	}
	b.ResetTimer()
	for range b.N {
		s := state.NewMemory()
		for i := 0; i < keys; i += batch {
			if err := s.Apply(ws[i:min(i+batch, keys)], state.Checkpoint{Offset: int64(i + batch)}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*keys), "ns/record")
}
