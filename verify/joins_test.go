package verify

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestTableJoinFollowsTheTablesTime(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	rec := func(topic string, p int32, off int64, key, value string, s int) *kgo.Record {
		r := &kgo.Record{Topic: topic, Partition: p, Offset: off, Timestamp: at(s)}
		if key != "" {
			r.Key = []byte(key)
		}
		if value != "" {
			r.Value = []byte(value)
		}
		return r
	}
	table := []*kgo.Record{
		rec("t", 0, 3, "a", "", 50), // a tombstone, given out of offset order
		rec("t", 0, 0, "a", "a1", 10),
		rec("t", 0, 1, "a", "a2", 30),
		rec("t", 0, 2, "b", "b1", 20),
		rec("t", 1, 0, "a", "other partition", 0),
	}
	stream := []*kgo.Record{
		rec("s", 0, 0, "a", "x", 15), // a1
		rec("s", 0, 1, "b", "x", 5),  // b not yet
		rec("s", 0, 2, "a", "x", 30), // a tie: the table's a2 first
		rec("s", 0, 3, "b", "x", 25), // late: the table stays at 30, b1
		rec("s", 0, 4, "a", "x", 60), // deleted
		rec("s", 0, 5, "", "x", 70),  // no key
		rec("s", 1, 0, "a", "x", 0),
	}
	want := map[int64]Joined{0: {[]byte("a1"), true}, 1: {}, 2: {[]byte("a2"), true}, 3: {[]byte("b1"), true}, 4: {}, 5: {}}
	got := TableJoin(table, stream)
	if len(got) != len(stream) {
		t.Fatalf("%d joins for %d stream records", len(got), len(stream))
	}
	for off, w := range want {
		g := got[Position{Topic: "s", Partition: 0, Offset: off}]
		if string(g.Value) != string(w.Value) || g.OK != w.OK {
			t.Errorf("s[0]@%d joined with %q (%t), want %q (%t)", off, g.Value, g.OK, w.Value, w.OK)
		}
	}
	if g := got[Position{Topic: "s", Partition: 1, Offset: 0}]; string(g.Value) != "other partition" {
		t.Errorf("partition 1 joined with %q: partitions are apart", g.Value)
	}
}
