package verify_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/verify"
	"github.com/eoskit/eoskit/window"
)

// CountWindows follows each partition's offsets whatever order the
// records come in: a record is late against its own partition's stream
// time only, and the windows closed at the end are those its partition's
// stream time passed.
func TestCountWindowsFollowsEachPartitionsStreamTime(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	rec := func(p int32, off int64, key string, d time.Duration) *kgo.Record {
		return &kgo.Record{Partition: p, Offset: off, Key: []byte(key), Timestamp: t0.Add(d)}
	}
	wk := func(key string, start time.Duration) string {
		return string(window.AppendKey(nil, []byte(key), t0.Add(start)))
	}
	// Given out of order: partition 1's records first, offsets reversed.
	wc := verify.CountWindows([]*kgo.Record{
		rec(1, 1, "b", 10*time.Second), // partition 1's stream time is 00:00:20 (offset 0): not late
		rec(1, 0, "b", 20*time.Second),
		rec(0, 2, "a", 30*time.Second), // after 00:02:00 on partition 0: window 00:00 closed at 01:10, late
		rec(0, 1, "a", 2*time.Minute),
		rec(0, 0, "a", 5*time.Second),
	}, time.Minute, 10*time.Second)
	if wc.Late != 1 || wc.Counts[wk("a", 0)] != 1 || wc.Counts[wk("a", 2*time.Minute)] != 1 || wc.Counts[wk("b", 0)] != 2 {
		t.Fatalf("late %d, counts %v", wc.Late, wc.Counts)
	}
	if wc.IgnoringLateness[wk("a", 0)] != 2 {
		t.Fatalf("ignoring lateness: %v", wc.IgnoringLateness)
	}
	if len(wc.Closed) != 1 || wc.Closed[wk("a", 0)] != 1 {
		t.Fatalf("closed %v; want only partition 0's window of 00:00 (partition 1's stream time never passed 01:10)", wc.Closed)
	}
}

// SumWindows adds each record's value by the time it gives, and a record
// it is told to leave out moves no stream time: had the far-future one
// counted, the window of 00:00 would have closed before the last record.
func TestSumWindowsAddsValuesAndSkipsWhatItIsToldTo(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	type v struct {
		at    time.Duration
		value int64
		ok    bool
	}
	vals := []v{{0, 3, true}, {time.Hour, 0, false}, {30 * time.Second, 4, true}}
	var recs []*kgo.Record
	for i := range vals {
		recs = append(recs, &kgo.Record{Offset: int64(i), Key: []byte("a"), Value: []byte{byte(i)}})
	}
	wc := verify.SumWindows(recs, time.Minute, 0, 0, func(r *kgo.Record) (time.Time, int64, bool) {
		x := vals[r.Value[0]]
		return t0.Add(x.at), x.value, x.ok
	})
	if got := wc.Counts[string(window.AppendKey(nil, []byte("a"), t0))]; got != 7 || wc.Late != 0 || len(wc.Closed) != 0 {
		t.Fatalf("sum %d, late %d, closed %v; want 7, 0 and none", got, wc.Late, wc.Closed)
	}
}

// A window is expired once its partition's stream time reaches its start
// plus retention, and with no retention never.
func TestSumWindowsExpiresByRetention(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	recs := []*kgo.Record{
		{Offset: 0, Key: []byte("a"), Timestamp: t0},
		{Offset: 1, Key: []byte("a"), Timestamp: t0.Add(70 * time.Second)},
		{Offset: 2, Key: []byte("b"), Timestamp: t0.Add(2 * time.Minute)},
	}
	of := func(r *kgo.Record) (time.Time, int64, bool) { return r.Timestamp, 1, true }
	wc := verify.SumWindows(recs, time.Minute, 0, 2*time.Minute, of)
	first, second := string(window.AppendKey(nil, []byte("a"), t0)), string(window.AppendKey(nil, []byte("a"), t0.Add(time.Minute)))
	if !wc.Expired[first] || wc.Expired[second] || len(wc.Expired) != 1 {
		t.Fatalf("expired %v; want only a's window of 00:00 (00:01's expires at 00:03)", wc.Expired)
	}
	if wc := verify.SumWindows(recs, time.Minute, 0, 0, of); len(wc.Expired) != 0 {
		t.Fatalf("expired %v without retention", wc.Expired)
	}
}

// CountSessions extends, merges and closes sessions by each partition's
// stream time, and finds a record late that would reach a closed session.
func TestCountSessionsFollowsTheRules(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var off int64
	rec := func(key string, d time.Duration) *kgo.Record {
		off++
		return &kgo.Record{Offset: off, Key: []byte(key), Timestamp: t0.Add(d)}
	}
	wc := verify.CountSessions([]*kgo.Record{
		rec("b", 0), rec("b", 8*time.Minute), rec("b", 4*time.Minute), // merged: 00:00-00:08
		rec("a", 20*time.Minute), // b closed at 00:18
		rec("b", 9*time.Minute),  // late
		rec("a", 21*time.Minute),
	}, 5*time.Minute, 5*time.Minute)
	sk := func(key string, s, e time.Duration) string {
		return string(window.AppendSessionKey(nil, []byte(key), window.Session{Start: t0.Add(s), End: t0.Add(e)}))
	}
	if wc.Late != 1 || len(wc.Counts) != 2 || wc.Counts[sk("b", 0, 8*time.Minute)] != 3 || wc.Counts[sk("a", 20*time.Minute, 21*time.Minute)] != 2 {
		t.Fatalf("counts %v, late %d", wc.Counts, wc.Late)
	}
	if len(wc.Closed) != 1 || wc.Closed[sk("b", 0, 8*time.Minute)] != 3 {
		t.Fatalf("closed %v; want b's session only", wc.Closed)
	}
}
