package verify

import (
	"cmp"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/window"
)

// WindowCounts is what a count or a sum per key and tumbling window of
// record time must end at, computed by [CountWindows] or [SumWindows]
// from the committed input.
// Windows are keyed by [window.AppendKey] of the record key and the
// window's start.
type WindowCounts struct {
	// Counts is each window's true count: its records that came while
	// it was open.
	Counts map[string]int64
	// Late is how many records came after all their windows closed.
	Late int
	// IgnoringLateness is what a count that takes late records anyway
	// ends at: a truth that equals Counts cannot tell the two apart.
	IgnoringLateness map[string]int64
	// Closed is the counts of the windows closed at the end (their
	// partition's stream time past their end plus grace): the finals a
	// count emitting them once must have written, and no other.
	Closed map[string]int64
	// Expired holds the windows of Counts past their retention at the
	// end (their partition's stream time reached their start plus
	// retention): deleted from the store and its outputs (a tombstone),
	// their finals written before.
	Expired map[string]bool
}

// CountWindows counts recs (a topic's committed records) per key and
// tumbling window of size by their timestamps: [SumWindows] with each
// record's timestamp and 1, and no retention.
func CountWindows(recs []*kgo.Record, size, grace time.Duration) WindowCounts {
	return SumWindows(recs, size, grace, 0, func(r *kgo.Record) (time.Time, int64, bool) { return r.Timestamp, 1, true })
}

// SumWindows sums recs (a topic's committed records) per key and tumbling
// window of size by the time and value of returns for each, as the rules
// say and without package window's own: each partition's records in
// offset order, its stream time the largest record time so far, a record
// added to its window unless that stream time, with it, reached the
// window's end plus grace. A record of returns false is left out, as a
// processor parks a record it cannot use (it moves no stream time). recs
// may come in any order. Late counts the records left out as late. A
// window is expired once its partition's stream time reaches its start
// plus retention (0: never); times must be past the epoch.
func SumWindows(recs []*kgo.Record, size, grace, retention time.Duration, of func(*kgo.Record) (at time.Time, value int64, ok bool)) WindowCounts {
	recs = slices.Clone(recs)
	slices.SortStableFunc(recs, func(a, b *kgo.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	sizeMs, graceMs := size.Milliseconds(), grace.Milliseconds()
	wc := WindowCounts{Counts: map[string]int64{}, IgnoringLateness: map[string]int64{}, Closed: map[string]int64{}, Expired: map[string]bool{}}
	starts := map[string]int64{}
	streamTime := map[int32]int64{}
	closesAt := map[string]int64{}  // a window's end plus grace
	partition := map[string]int32{} // a window's partition
	for _, r := range recs {
		at, v, ok := of(r)
		if !ok {
			continue
		}
		ms := at.UnixMilli()
		streamTime[r.Partition] = max(streamTime[r.Partition], ms)
		start := ms - ms%sizeMs
		key := string(window.AppendKey(nil, r.Key, time.UnixMilli(start)))
		wc.IgnoringLateness[key] += v
		closesAt[key], partition[key], starts[key] = start+sizeMs+graceMs, r.Partition, start
		if streamTime[r.Partition] >= closesAt[key] {
			wc.Late++
			continue
		}
		wc.Counts[key] += v
	}
	for key, n := range wc.Counts {
		if streamTime[partition[key]] >= closesAt[key] {
			wc.Closed[key] = n
		}
		if retention > 0 && streamTime[partition[key]] >= starts[key]+retention.Milliseconds() {
			wc.Expired[key] = true
		}
	}
	return wc
}
