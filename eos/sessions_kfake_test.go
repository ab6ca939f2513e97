package eos_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/window"
)

// sessionOf names a session's key of the store as "HH:MM-HH:MM".
func sessionOf(key []byte) (string, string, error) {
	k, ss, err := window.SplitSessionKey(key)
	return string(k), ss.Start.UTC().Format("15:04") + "-" + ss.End.UTC().Format("15:04"), err
}

// lastBySession is each session key's last value in recs ("nil" for a
// tombstone), as "key@HH:MM-HH:MM".
func lastBySession(t *testing.T, recs []*kgo.Record) map[string]string {
	t.Helper()
	last := map[string]string{}
	for _, r := range recs {
		k, s, err := sessionOf(r.Key)
		if err != nil {
			t.Fatalf("a record keyed %q, no session's", r.Key)
		}
		v := string(r.Value)
		if r.Value == nil {
			v = "nil"
		}
		last[k+"@"+s] = v
	}
	return last
}

// Sessions of five minutes' gap and five of grace (closed ten minutes
// of stream time after their last record), on one partition: records
// extend a session, open a new one past the gap, merge two they both
// reach (the two deleted, the merged one written), and one that would
// extend a closed session is late. Each session closed is emitted once,
// with its count; a restart restores the sessions and the stream time, so
// a record reaching a session closed before it is still late, and one
// extending an open session extends it.
func TestSessionsExtendMergeAndClose(t *testing.T) {
	spec := window.Sessions{Gap: 5 * time.Minute, Grace: 5 * time.Minute, Retention: time.Hour}
	h, err := eos.SessionCount(spec, eos.EmitFinal("finals"))
	if err != nil {
		t.Fatal(err)
	}
	brokers := windowCluster(t)
	first := runAggregationOn(t, brokers, h, []report{
		{"a", at("0m")},
		{"b", at("0m")},
		{"b", at("8m")},  // past b's gap: a second session
		{"b", at("4m")},  // reaches both: merged into 00:00-00:08
		{"a", at("3m")},  // extends a's 00:00
		{"a", at("20m")}, // a new session; a sweep: a's 00:00-00:03 and b's closed
		{"a", at("16m")}, // extends a's 00:20 back to 00:16
		{"a", at("7m")},  // reaches a's 00:00-00:03, closed at 00:13: late
		{"c", at("31m")}, // a sweep: a's 00:16-00:20 closed at 00:30
	}, sessionOf, func(v *eos.StateView) {
		// The query: a's sessions overlapping 00:02 to 00:16.
		got, err := v.Sessions(0, []byte("a"), at("2m"), at("16m"))
		if err != nil || len(got) != 2 || !got[0].Session.End.Equal(at("3m")) || string(got[1].Value) != "2" || !got[1].Session.Start.Equal(at("16m")) {
			t.Errorf("State().Sessions(a, 00:02, 00:16) = %v, %v; want 00:00-00:03 and 00:16-00:20", got, err)
		}
		if got, err := v.Sessions(0, []byte("a"), at("4m"), at("15m")); err != nil || len(got) != 0 {
			t.Errorf("State().Sessions(a, 00:04, 00:15) = %v, %v; want none", got, err)
		}
		if _, err := v.Sessions(7, []byte("a"), at("0m"), at("1h")); !errors.Is(err, eos.ErrNotHeld) {
			t.Errorf("State().Sessions of a partition not held: %v, want ErrNotHeld", err)
		}
	})
	for _, ws := range first.windows {
		slices.Sort(ws)
	}
	want := map[string][]string{"a": {"00:00-00:03=2", "00:16-00:20=2"}, "b": {"00:00-00:08=3"}, "c": {"00:31-00:31=1"}}
	if !maps.EqualFunc(first.windows, want, slices.Equal) {
		t.Fatalf("the store holds %v, want %v", first.windows, want)
	}
	live := lastBySession(t, first.updates)
	maps.DeleteFunc(live, func(_, v string) bool { return v == "nil" })
	if want := map[string]string{"a@00:00-00:03": "2", "a@00:16-00:20": "2", "b@00:00-00:08": "3", "c@00:31-00:31": "1"}; !maps.Equal(live, want) {
		t.Fatalf("the updates leave %v, want %v (the sessions merged or extended deleted)", live, want)
	}
	var finals []string
	for _, r := range first.finals {
		k, s, _ := sessionOf(r.Key)
		finals = append(finals, fmt.Sprintf("%s@%s=%s", k, s, r.Value))
	}
	if want := []string{"a@00:00-00:03=2", "b@00:00-00:08=3", "a@00:16-00:20=2"}; !slices.Equal(finals, want) || first.late != 1 {
		t.Fatalf("finals %v (late %v); want %v, once each, in the order they closed, and one late", finals, first.late, want)
	}

	second := runAggregationOn(t, brokers, h, []report{
		{"a", at("25m")}, // reaches a's 00:16-00:20, closed before the restart: late
		{"c", at("33m")}, // extends c's 00:31
	}, sessionOf)
	if got := second.windows["c"]; !slices.Equal(got, []string{"00:31-00:33=2"}) || second.late != 1 {
		t.Fatalf("after the restart, c's sessions %v (late %v); want 00:31-00:33=2 and a's report late", got, second.late)
	}
	if len(second.finals) != len(first.finals) {
		t.Fatalf("%d finals after the restart, want the %d of the first run and no other", len(second.finals), len(first.finals))
	}
}

// With the default retention (twice the gap plus grace), a session swept
// after it closed stays indexed while a record may still reach it: such a
// record is late, whether or not a sweep ran, and opens no session beside
// the closed one. A session past retention is deleted at the next sweep.
func TestSessionsKeptWhileARecordMayReachThem(t *testing.T) {
	h, err := eos.SessionCount(window.SessionsOf(5*time.Minute, 0), eos.EmitFinal("finals"))
	if err != nil {
		t.Fatal(err)
	}
	run := runAggregationOn(t, windowCluster(t), h, []report{
		{"a", at("0m")},
		{"b", at("6m")},  // a sweep: a's 00:00 closed (final), still kept
		{"a", at("4m")},  // reaches it: late
		{"b", at("11m")}, // extends b; a's 00:00 expired at 00:10: deleted
	}, sessionOf)
	if got := run.windows["a"]; len(got) != 0 || run.late != 1 {
		t.Fatalf("a's sessions %v (late %v); want none kept and the 00:04 report late", got, run.late)
	}
	if got := run.windows["b"]; !slices.Equal(got, []string{"00:06-00:11=2"}) {
		t.Fatalf("b's sessions %v; want 00:06-00:11=2", got)
	}
	if len(run.finals) != 1 {
		t.Fatalf("%d finals, want a's 00:00 once", len(run.finals))
	}
}
