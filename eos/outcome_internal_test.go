package eos

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

func TestAbortedBeforeNeedsEveryPartitionStableAndBehind(t *testing.T) {
	a, b := topicPartition{"in", 0}, topicPartition{"in", 1}
	ends := map[topicPartition]int64{a: 500, b: 300}
	for _, c := range []struct {
		name    string
		fetched map[topicPartition]stableOffset
		want    bool
	}{
		{"both behind their ends: aborted", map[topicPartition]stableOffset{a: {0, nil}, b: {200, nil}}, true},
		{"never committed (-1) anywhere: aborted", map[topicPartition]stableOffset{a: {-1, nil}, b: {-1, nil}}, true},
		{"one at its end: committed", map[topicPartition]stableOffset{a: {500, nil}, b: {200, nil}}, false},
		{"one pending: unknown", map[topicPartition]stableOffset{a: {0, nil}, b: {0, kerr.UnstableOffsetCommit}}, false},
		{"one missing from the answer: unknown", map[topicPartition]stableOffset{a: {0, nil}}, false},
	} {
		if got := abortedBefore(ends, c.fetched); got != c.want {
			t.Errorf("%s: abortedBefore = %v, want %v", c.name, got, c.want)
		}
	}
}
