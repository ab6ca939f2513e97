package state_test

import (
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
