package eos

import "testing"

// The producer's batch limit is the caller's, capped for the topics whose
// max.message.bytes Run learnt, never below what franz-go takes.
func TestBatchLimitsCapTheStateTopicsOnly(t *testing.T) {
	b := newBatchLimits(func(topic string) int32 {
		if topic == "small-by-caller" {
			return 2048
		}
		return 1_000_012
	})
	b.learn("changelog", 4096)
	b.learn("small-by-caller", 8192)
	b.learn("tiny", 100)
	b.learn("huge", 5<<30)
	for topic, want := range map[string]int32{"changelog": 4096, "small-by-caller": 2048, "tiny": minBatchBytes, "huge": 1_000_012, "output": 1_000_012, "": 1_000_012} {
		if got := b.limit(topic); got != want {
			t.Errorf("limit(%q) = %d, want %d", topic, got, want)
		}
	}
}
