package eos

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
)

// A purge deletes below the committed offset of each partition of the
// repartition topic that moved past what was purged, and leaves alone
// other topics, failed fetches, and partitions purged to their offset.
func TestPurgeBelowTheCommittedOffsetsOnly(t *testing.T) {
	committed := kadm.OffsetResponses{
		"by-region": {
			0: {Offset: kadm.Offset{Topic: "by-region", Partition: 0, At: 40}},
			1: {Offset: kadm.Offset{Topic: "by-region", Partition: 1, At: 10}},                      // purged to 10 already
			2: {Offset: kadm.Offset{Topic: "by-region", Partition: 2, At: 7}, Err: errors.New("x")}, // failed
			3: {Offset: kadm.Offset{Topic: "by-region", Partition: 3, At: 0}},                       // nothing counted
		},
		"reports": {0: {Offset: kadm.Offset{Topic: "reports", Partition: 0, At: 99}}},
	}
	below := purgeBelow(committed, "by-region", map[int32]int64{1: 10})
	if len(below) != 1 || len(below["by-region"]) != 1 {
		t.Fatalf("purge %v; want partition 0 of by-region alone", below)
	}
	if o, ok := below.Lookup("by-region", 0); !ok || o.At != 40 {
		t.Fatalf("purge of partition 0 below %v; want below 40, its committed offset", o)
	}
}
