package verify

import (
	"cmp"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Joined is what a stream–table join must give one stream record: the
// value of its key in the table at the record's time, and whether the
// table held the key.
type Joined struct {
	Value []byte
	OK    bool
}

// TableJoin computes, from a co-partitioned table's committed records and
// the stream records joined with it (read_committed; leave out those a
// join dead-lettered: they never move the table), what each stream record
// must have been joined with under eos.Table's rule: per partition, in
// offset order, before each stream record the table advances through its
// records whose timestamp is at or before the stream record's, stopping
// at the first later one; a nil value deletes its key. It assumes the
// table's records were all committed before the stream's were handled
// (the rule does not wait for records not yet written). Keyed by the
// stream records' positions.
func TableJoin(table, stream []*kgo.Record) map[Position]Joined {
	byOffset := func(a, b *kgo.Record) int { return cmp.Compare(a.Offset, b.Offset) }
	tables := map[int32][]*kgo.Record{}
	for _, r := range table {
		tables[r.Partition] = append(tables[r.Partition], r)
	}
	streams := map[int32][]*kgo.Record{}
	for _, r := range stream {
		streams[r.Partition] = append(streams[r.Partition], r)
	}
	out := map[Position]Joined{}
	for p, recs := range streams {
		slices.SortFunc(recs, byOffset)
		t := tables[p]
		slices.SortFunc(t, byOffset)
		values := map[string][]byte{}
		next := 0
		for _, r := range recs {
			for ; next < len(t) && !t[next].Timestamp.After(r.Timestamp); next++ {
				switch {
				case t[next].Key == nil:
				case t[next].Value == nil:
					delete(values, string(t[next].Key))
				default:
					values[string(t[next].Key)] = t[next].Value
				}
			}
			var j Joined
			if r.Key != nil {
				j.Value, j.OK = values[string(r.Key)]
			}
			out[Position{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}] = j
		}
	}
	return out
}
