package verify

import (
	"cmp"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/window"
)

// CountSessions counts recs (a topic's committed records) per key and
// session of their timestamps, as eos's rules say (Kafka Streams' but
// stricter on lateness: see eos.SessionCount) and without eos's or
// package window's code: each
// partition's records in offset order, its stream time the largest
// timestamp so far (with the record); a key's records no more than gap
// apart make one session, a record within gap of two merging them; a
// session is closed once stream time passes its last record's time plus
// gap plus grace, and a record that would extend or merge a closed
// session, or whose session would be closed at once, is late. Sessions
// are keyed by [window.AppendSessionKey]. Closed holds the sessions
// closed at the end, Counts every session, Late the late records. recs
// may come in any order.
func CountSessions(recs []*kgo.Record, gap, grace time.Duration) WindowCounts {
	recs = slices.Clone(recs)
	slices.SortStableFunc(recs, func(a, b *kgo.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	gapMs, graceMs := gap.Milliseconds(), grace.Milliseconds()
	type session struct{ start, end, n int64 }
	streamTime := map[int32]int64{}
	byKey := map[int32]map[string][]session{}
	wc := WindowCounts{Counts: map[string]int64{}, Closed: map[string]int64{}, Expired: map[string]bool{}}
	closed := func(s session, now int64) bool { return now > s.end+gapMs+graceMs }
	for _, r := range recs {
		p, t := r.Partition, r.Timestamp.UnixMilli()
		now := max(streamTime[p], t)
		streamTime[p] = now
		if byKey[p] == nil {
			byKey[p] = map[string][]session{}
		}
		key := string(r.Key)
		joined := session{start: t, end: t, n: 1}
		var keep []session
		late := false
		for _, s := range byKey[p][key] {
			if t < s.start-gapMs || t > s.end+gapMs {
				keep = append(keep, s)
				continue
			}
			late = late || closed(s, now)
			joined.start, joined.end, joined.n = min(joined.start, s.start), max(joined.end, s.end), joined.n+s.n
		}
		if late || closed(joined, now) {
			wc.Late++
			continue
		}
		byKey[p][key] = append(keep, joined)
	}
	for p, keys := range byKey {
		for key, ss := range keys {
			for _, s := range ss {
				k := string(window.AppendSessionKey(nil, []byte(key), window.Session{Start: time.UnixMilli(s.start), End: time.UnixMilli(s.end)}))
				wc.Counts[k] = s.n
				if closed(s, streamTime[p]) {
					wc.Closed[k] = s.n
				}
			}
		}
	}
	return wc
}
