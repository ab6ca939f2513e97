package window_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/eoskit/eoskit/window"
)

var t0 = time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)

// For returns exactly the windows whose [start, end) holds the time, for
// tumbling and hopping specs, checked against every aligned start near
// the time.
func TestForReturnsTheWindowsHoldingTheTime(t *testing.T) {
	specs := []window.Spec{
		window.Tumbling(time.Minute, 0),
		window.Tumbling(24*time.Hour, time.Hour),
		window.Hopping(10*time.Millisecond, 3*time.Millisecond, 0),
		window.Hopping(time.Hour, 15*time.Minute, time.Minute),
		{Size: 7 * time.Millisecond}, // Advance 0: tumbling
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range specs {
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		adv := s.Advance
		if adv == 0 {
			adv = s.Size
		}
		for range 2000 {
			at := time.UnixMilli(rng.Int64N(1 << 42))
			var want []window.Window
			lo := max(0, at.UnixMilli()-s.Size.Milliseconds())
			for start := lo - lo%adv.Milliseconds(); start <= at.UnixMilli(); start += adv.Milliseconds() {
				w := window.Window{Start: time.UnixMilli(start), End: time.UnixMilli(start).Add(s.Size)}
				if start >= 0 && !at.Before(w.Start) && at.Before(w.End) {
					want = append(want, w)
				}
			}
			got := s.For(at)
			if !slices.EqualFunc(got, want, func(a, b window.Window) bool { return a.Start.Equal(b.Start) && a.End.Equal(b.End) }) {
				t.Fatalf("%+v: For(%d) = %v, want %v", s, at.UnixMilli(), got, want)
			}
		}
	}
	if ws := window.Tumbling(time.Minute, 0).For(time.UnixMilli(-1)); ws != nil {
		t.Fatalf("a time before the epoch falls in %v", ws)
	}
	if ws := window.Hopping(10*time.Millisecond, 3*time.Millisecond, 0).For(time.UnixMilli(1)); len(ws) != 1 || ws[0].Start.UnixMilli() != 0 {
		t.Fatalf("a time just after the epoch falls in %v, want only the window starting at 0", ws)
	}
}

// A window closes when stream time reaches its end plus grace, not a
// millisecond before; it expires when stream time reaches its start plus
// retention (size + grace by default).
func TestClosedAndExpiredAtTheirBoundaries(t *testing.T) {
	s := window.Tumbling(24*time.Hour, time.Hour)
	w := s.For(t0.Add(time.Hour))[0]
	if !w.Start.Equal(t0) || !w.End.Equal(t0.Add(24*time.Hour)) {
		t.Fatalf("window %v", w)
	}
	closeAt := t0.Add(25 * time.Hour)
	if s.Closed(w, closeAt.Add(-time.Millisecond)) || !s.Closed(w, closeAt) {
		t.Fatal("the window does not close exactly at end + grace")
	}
	if s.Expired(w, closeAt.Add(-time.Millisecond)) || !s.Expired(w, closeAt) {
		t.Fatal("the window does not expire exactly at start + size + grace (the default retention)")
	}
	s.Retention = 7 * 24 * time.Hour
	if s.Expired(w, t0.Add(7*24*time.Hour-time.Millisecond)) || !s.Expired(w, t0.Add(7*24*time.Hour)) {
		t.Fatal("the window does not expire exactly at start + retention")
	}
}

// Open gives the windows still taking records, and a LateError naming the
// last window when none is.
func TestOpenRefusesALateRecord(t *testing.T) {
	s := window.Hopping(time.Hour, 30*time.Minute, 10*time.Minute)
	at := t0.Add(50 * time.Minute) // in [0:00, 1:00) and [0:30, 1:30)
	if ws, err := s.Open(at, at); err != nil || len(ws) != 2 {
		t.Fatalf("at its own time: %v, %v", ws, err)
	}
	ws, err := s.Open(at, t0.Add(70*time.Minute)) // the first closed at 1:10
	if err != nil || len(ws) != 1 || !ws[0].Start.Equal(t0.Add(30*time.Minute)) {
		t.Fatalf("with the first window closed: %v, %v", ws, err)
	}
	_, err = s.Open(at, t0.Add(100*time.Minute)) // the second closed at 1:40
	var late *window.LateError
	if !errors.As(err, &late) || !errors.Is(err, window.ErrLate) || !late.Window.Start.Equal(t0.Add(30*time.Minute)) {
		t.Fatalf("with both closed: %v, want a LateError naming the window from 0:30", err)
	}
	for _, out := range []time.Time{time.UnixMilli(-5), window.MaxTime.Add(time.Millisecond), time.UnixMilli(1<<63 - 1)} {
		if ws, err := s.Open(out, t0); ws != nil || !errors.Is(err, window.ErrOutOfRange) {
			t.Fatalf("%s: %v, %v; want ErrOutOfRange", out, ws, err)
		}
	}
}

func TestValidateRefusesWhatCannotWork(t *testing.T) {
	for _, s := range []window.Spec{
		{},
		{Size: -time.Minute},
		{Size: 1500 * time.Microsecond},
		{Size: time.Minute, Advance: 2 * time.Minute},
		{Size: time.Minute, Advance: -time.Second},
		{Size: time.Minute, Advance: 1500 * time.Microsecond},
		{Size: time.Minute, Grace: -time.Second},
		{Size: time.Minute, Grace: time.Minute / 3 * 2 / 7},
		{Size: time.Minute, Retention: time.Hour + time.Microsecond},
		{Size: time.Minute, Grace: time.Minute, Retention: 90 * time.Second},
	} {
		if err := s.Validate(); !errors.Is(err, window.ErrSpec) {
			t.Errorf("%+v: %v, want ErrSpec", s, err)
		}
	}
	if err := (window.Spec{Size: time.Minute, Grace: 1<<63 - 1}).Validate(); !errors.Is(err, window.ErrSpec) {
		t.Errorf("a grace that would overflow size + grace: %v", err)
	}
	if err := (window.Spec{Size: time.Minute, Grace: time.Minute, Retention: 2 * time.Minute}).Validate(); err != nil {
		t.Errorf("retention of exactly size + grace: %v", err)
	}
}

// A hopping spec puts each record in Size/Advance windows, each a key
// written in the record's transaction: a century advancing by a
// millisecond would enumerate some 3e12 windows for one record (the
// processor would stall in it, not fail), so Validate bounds them.
func TestValidateBoundsTheWindowsARecordFallsIn(t *testing.T) {
	at := window.MaxWindowsPerRecord
	for _, c := range []struct {
		spec window.Spec
		ok   bool
	}{
		{window.Hopping(100*365*24*time.Hour, time.Millisecond, 0), false},
		{window.Hopping(time.Duration(at+1)*time.Millisecond, time.Millisecond, 0), false},
		{window.Hopping(time.Duration(2*at+1)*time.Millisecond, 2*time.Millisecond, 0), false}, // rounds up: at+1
		{window.Hopping(time.Duration(2*at)*time.Millisecond, 2*time.Millisecond, 0), true},
		{window.Hopping(time.Duration(at)*time.Millisecond, time.Millisecond, 0), true},
		{window.Hopping(24*time.Hour, time.Minute, time.Hour), true}, // 1,440: a day's rolling total each minute
		{window.Tumbling(100*365*24*time.Hour, 0), true},
	} {
		err := c.spec.Validate()
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, window.ErrSpec)) {
			t.Errorf("%+v: %v, want ok=%v", c.spec, err, c.ok)
			continue
		}
		if c.ok && len(c.spec.For(time.UnixMilli(1e12))) > at {
			t.Errorf("%+v: a record falls in %d windows, over the bound %d", c.spec, len(c.spec.For(time.UnixMilli(1e12))), at)
		}
	}
}

func TestKeysRoundTrip(t *testing.T) {
	for _, key := range [][]byte{nil, {}, []byte("region-7"), {0, 0xff, 0}} {
		b := window.AppendKey(nil, key, t0)
		got, start, err := window.SplitKey(b)
		if err != nil || string(got) != string(key) || !start.Equal(t0) {
			t.Fatalf("%q: %q %v %v", key, got, start, err)
		}
	}
	if _, _, err := window.SplitKey([]byte("short")); !errors.Is(err, window.ErrShortKey) {
		t.Fatalf("a short key: %v", err)
	}
}

func TestStartsListsAlignedStartsWithinALimit(t *testing.T) {
	s := window.Hopping(time.Hour, 15*time.Minute, 0)
	got, err := s.Starts(t0.Add(time.Minute), t0.Add(time.Hour), 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Time{t0.Add(15 * time.Minute), t0.Add(30 * time.Minute), t0.Add(45 * time.Minute), t0.Add(time.Hour)}
	if !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Fatalf("%v, want %v", got, want)
	}
	if _, err := s.Starts(t0, t0.Add(24*time.Hour), 10); err == nil {
		t.Fatal("97 starts passed a limit of 10")
	}
	if got, err := s.Starts(time.UnixMilli(1<<63-1-1000), time.UnixMilli(1<<63-1), 10); err != nil || got != nil {
		t.Fatalf("a range past MaxTime: %d starts, %v; want none", len(got), err)
	}
	if got, err := s.Starts(t0.Add(time.Minute), t0.Add(2*time.Minute), 10); err != nil || got != nil {
		t.Fatalf("no start in range: %v, %v", got, err)
	}
}

// ExpiresBetween (ClosesBetween) says yes exactly when a window start
// plus retention (plus size and grace) lies in (was, now], checked against every window near the times, for
// retentions that are and are not multiples of the advance.
func TestBetweenFindsEveryExpiryAndClosePoint(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range []window.Spec{
		window.Tumbling(time.Minute, 20*time.Second), // retention 80 s, advance 60 s
		window.Hopping(time.Hour, 15*time.Minute, time.Minute),
		{Size: time.Minute, Advance: time.Minute, Retention: 2 * time.Minute},
	} {
		for range 2000 {
			was := time.UnixMilli(rng.Int64N(1<<36) + 1)
			now := was.Add(time.Duration(rng.Int64N(int64(2 * s.Size))))
			want := false
			adv := s.Advance
			if adv == 0 {
				adv = s.Size
			}
			ret := max(s.Retention, s.Size+s.Grace)
			lo := max(0, was.Add(-ret-adv).UnixMilli())
			for start := lo - lo%adv.Milliseconds(); start <= now.UnixMilli(); start += adv.Milliseconds() {
				w := s.Starting(time.UnixMilli(start))
				if !s.Expired(w, was) && s.Expired(w, now) {
					want = true
				}
			}
			if got := s.ExpiresBetween(was, now); got != want {
				t.Fatalf("%+v: ExpiresBetween(%d, %d) = %v, want %v", s, was.UnixMilli(), now.UnixMilli(), got, want)
			}
			wantClose := false
			for start := lo - lo%adv.Milliseconds(); start <= now.UnixMilli(); start += adv.Milliseconds() {
				w := s.Starting(time.UnixMilli(start))
				if !s.Closed(w, was) && s.Closed(w, now) {
					wantClose = true
				}
			}
			if got := s.ClosesBetween(was, now); got != wantClose {
				t.Fatalf("%+v: ClosesBetween(%d, %d) = %v, want %v", s, was.UnixMilli(), now.UnixMilli(), got, wantClose)
			}
		}
	}
	if s := window.Tumbling(time.Minute, 0); !s.ExpiresBetween(time.Time{}, t0) || !s.ClosesBetween(time.Time{}, t0) {
		t.Fatal("the first stream time does not ask for a sweep")
	}
}

// AppendOpen appends t's open windows to what dst holds, in place while
// dst has room, and writes nothing else of dst's array: not past what it
// returns, nor anything when t is late or out of range.
func TestAppendOpenAppendsOnlyTheOpenWindows(t *testing.T) {
	s := window.Hopping(time.Minute, 20*time.Second, 0)
	at := t0.Add(65 * time.Second) // in the windows starting 0:20, 0:40, 1:00
	sentinel := window.Window{Start: time.UnixMilli(1)}
	fresh := func() []window.Window {
		ws := make([]window.Window, 8)
		for i := range ws {
			ws[i] = sentinel
		}
		return ws
	}
	starts := func(ws []window.Window) []time.Duration {
		var out []time.Duration
		for _, w := range ws {
			out = append(out, w.Start.Sub(t0))
		}
		return out
	}
	// Stream time 1:25: the window 0:20-1:20 is closed, 0:40 and 1:00 open.
	backing := fresh()
	got, err := s.AppendOpen(backing[:1], at, t0.Add(85*time.Second))
	if want := []time.Duration{40 * time.Second, time.Minute}; err != nil || len(got) != 3 || got[0] != sentinel || !slices.Equal(starts(got[1:]), want) {
		t.Fatalf("AppendOpen = %v, %v; want the prior window, then the two open ones, starting %v after %s", got, err, want, t0)
	}
	if &got[0] != &backing[0] {
		t.Fatal("AppendOpen did not append in place while dst had room")
	}
	for i, w := range backing[len(got):] {
		if w != sentinel {
			t.Fatalf("AppendOpen wrote %v at %d, past the %d windows it returned", w, len(got)+i, len(got))
		}
	}
	for name, streamTime := range map[string]time.Time{"late": t0.Add(time.Hour), "out of range": t0} {
		at := at
		if name == "out of range" {
			at = time.UnixMilli(-1)
		}
		backing := fresh()
		got, err := s.AppendOpen(backing[:1], at, streamTime)
		if err == nil || len(got) != 1 || &got[0] != &backing[0] {
			t.Fatalf("%s: AppendOpen = %v, %v; want dst as it was and an error", name, got, err)
		}
		if !slices.Equal(backing, fresh()) {
			t.Fatalf("%s: AppendOpen wrote into dst's array: %v", name, backing)
		}
	}
	// A stack array of room enough: nothing allocated.
	if n := testing.AllocsPerRun(100, func() {
		var inline [4]window.Window
		if _, err := s.AppendOpen(inline[:0], at, at); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("AppendOpen into a stack array allocated %v times", n)
	}
}

// AppendOpen's windows are exactly those of For that Closed says are
// open at the stream time, late errors when none is, for random specs,
// record times and stream times (sub-millisecond ones included, around
// each window's close).
func TestAppendOpenAgreesWithClosed(t *testing.T) {
	rng := rand.New(rand.NewPCG(45, 6))
	for i := range 20000 {
		adv := time.Duration(1+rng.IntN(5)) * time.Millisecond
		spec := window.Hopping(adv*time.Duration(1+rng.IntN(4)), adv, time.Duration(rng.IntN(4))*time.Millisecond)
		at := time.UnixMilli(int64(rng.IntN(100))).Add(time.Duration(rng.IntN(1000)) * time.Microsecond)
		stream := at.Add(time.Duration(rng.IntN(20000)-5000) * time.Microsecond)
		if i%10 == 0 {
			stream = time.Time{}
		}
		var want []window.Window
		for _, w := range spec.For(at) {
			if !spec.Closed(w, stream) {
				want = append(want, w)
			}
		}
		got, err := spec.AppendOpen(nil, at, stream)
		if len(want) == 0 {
			if !errors.Is(err, window.ErrLate) {
				t.Fatalf("%+v at %v, stream time %v: %v, %v; want late", spec, at, stream, got, err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%+v at %v, stream time %v: %v, %v; want %v", spec, at, stream, got, err, want)
		}
	}
}

// InRange holds the times from the Unix epoch to MaxTime, both included,
// with or without a monotonic reading, in any location.
func TestInRangeIsFromTheEpochToMaxTime(t *testing.T) {
	epoch := time.Unix(0, 0)
	cases := []struct {
		t    time.Time
		want bool
	}{
		{epoch, true},
		{epoch.Add(-time.Nanosecond), false},
		{epoch.Add(-time.Second), false},
		{window.MaxTime, true},
		{window.MaxTime.Add(time.Nanosecond), false},
		{window.MaxTime.Add(-time.Nanosecond), true},
		{window.MaxTime.Add(time.Second), false},
		{window.MaxTime.In(time.FixedZone("east", 14*3600)), true},
		{window.MaxTime.Add(time.Nanosecond).In(time.FixedZone("west", -12*3600)), false},
		{time.Now(), true}, // monotonic
		{t0, true},
		{time.Time{}, false},
	}
	for _, c := range cases {
		if got := window.InRange(c.t); got != c.want {
			t.Errorf("InRange(%s) = %v, want %v", c.t.Format(time.RFC3339Nano), got, c.want)
		}
		if want := !c.t.Before(epoch) && !c.t.After(window.MaxTime); want != c.want {
			t.Errorf("case %s: the comparison with MaxTime says %v", c.t.Format(time.RFC3339Nano), want)
		}
	}
}

// MaxTime is the end of year 9999, UTC.
func TestMaxTimeIsTheEndOfYear9999(t *testing.T) {
	if want := time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC); window.MaxTime != want || window.MaxTime.Location() != time.UTC {
		t.Fatalf("MaxTime = %s, want %s", window.MaxTime.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
	}
}
