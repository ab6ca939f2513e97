package verify

import (
	"cmp"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TTLCounts is what a count per key whose keys expire must end at,
// computed by [CountWithTTL] from the committed input.
type TTLCounts struct {
	// Counts is each live key's count: its records since it last came
	// back after expiring (or since its first).
	Counts map[string]int64
	// Expired holds the keys expired at the end, by at least margin
	// (see CountWithTTL): deleted, whatever the sweeps' schedule.
	Expired map[string]bool
	// Undecided counts the keys expired at the end by less than margin:
	// a sweep may or may not have deleted them yet.
	Undecided int
}

// CountWithTTL counts recs (a topic's committed records) per key, each
// key expiring ttl after its last record by stream time, as the rules
// say and without eos's own: each partition's records in offset order,
// its stream time the largest timestamp so far (with the record), a
// key's last write stamped with that stream time, and a record of a key
// whose stamp is ttl or more behind counting from nothing. A key expired
// at the end by margin or more (a sweep has surely passed it) is in
// Expired, one expired by less in Undecided, the others in Counts. recs
// may come in any order.
func CountWithTTL(recs []*kgo.Record, ttl, margin time.Duration) TTLCounts {
	recs = slices.Clone(recs)
	slices.SortStableFunc(recs, func(a, b *kgo.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	ttlMs := ttl.Milliseconds()
	streamTime := map[int32]int64{}
	stamp := map[string]int64{}
	partition := map[string]int32{}
	counts := map[string]int64{}
	for _, r := range recs {
		now := max(streamTime[r.Partition], r.Timestamp.UnixMilli())
		streamTime[r.Partition] = now
		key := string(r.Key)
		if s, ok := stamp[key]; ok && now-s >= ttlMs {
			counts[key] = 0
		}
		counts[key]++
		stamp[key], partition[key] = now, r.Partition
	}
	tc := TTLCounts{Counts: map[string]int64{}, Expired: map[string]bool{}}
	for key, n := range counts {
		switch idle := streamTime[partition[key]] - stamp[key]; {
		case idle < ttlMs:
			tc.Counts[key] = n
		case idle >= ttlMs+margin.Milliseconds():
			tc.Expired[key] = true
		default:
			tc.Undecided++
		}
	}
	return tc
}
