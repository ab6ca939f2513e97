package window_test

import (
	"errors"
	"testing"
	"time"

	"github.com/eoskit/eoskit/window"
)

// A session's rules at their exact boundaries: a record reaches a
// session within the gap of either end; a session closes once stream
// time passes its end plus gap plus grace, and expires once it passes its
// end plus retention.
func TestSessionBoundaries(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := window.Sessions{Gap: 5 * time.Minute, Grace: time.Minute, Retention: 11 * time.Minute}
	ss := window.Session{Start: t0, End: t0.Add(2 * time.Minute)}
	ms := time.Millisecond
	for _, c := range []struct {
		name string
		got  bool
		want bool
	}{
		{"reaches at start - gap", s.Reaches(ss, t0.Add(-5*time.Minute)), true},
		{"reaches before start - gap", s.Reaches(ss, t0.Add(-5*time.Minute-ms)), false},
		{"reaches at end + gap", s.Reaches(ss, t0.Add(7*time.Minute)), true},
		{"reaches past end + gap", s.Reaches(ss, t0.Add(7*time.Minute+ms)), false},
		{"closed at end + gap + grace", s.Closed(ss, t0.Add(8*time.Minute)), false},
		{"closed past it", s.Closed(ss, t0.Add(8*time.Minute+ms)), true},
		{"expired at end + retention", s.Expired(ss, t0.Add(13*time.Minute)), false},
		{"expired past it", s.Expired(ss, t0.Add(13*time.Minute+ms)), true},
		{"default retention: 2 gap + grace", window.SessionsOf(5*time.Minute, time.Minute).Expired(ss, t0.Add(13*time.Minute+ms)), true},
		{"not before", window.SessionsOf(5*time.Minute, time.Minute).Expired(ss, t0.Add(13*time.Minute)), false},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
	key := window.AppendSessionKey(nil, []byte("north"), ss)
	k, back, err := window.SplitSessionKey(key)
	if err != nil || string(k) != "north" || !back.Start.Equal(ss.Start) || !back.End.Equal(ss.End) || len(key) != len("north")+window.SessionKeyLen {
		t.Fatalf("SplitSessionKey(AppendSessionKey) = %q %v %v", k, back, err)
	}
	if _, _, err := window.SplitSessionKey([]byte("short")); err == nil {
		t.Fatal("a key shorter than a session's split")
	}
}

// Invalid session specs are refused with ErrSpec.
func TestSessionsValidate(t *testing.T) {
	for _, s := range []window.Sessions{
		{},
		{Gap: 1500 * time.Microsecond},
		{Gap: time.Minute, Grace: -time.Second},
		{Gap: time.Minute, Grace: time.Minute, Retention: 150 * time.Second},
		{Gap: 101 * 365 * 24 * time.Hour},
	} {
		if err := s.Validate(); !errors.Is(err, window.ErrSpec) {
			t.Errorf("%+v: %v, want ErrSpec", s, err)
		}
	}
	if err := window.SessionsOf(time.Minute, time.Second).Validate(); err != nil {
		t.Fatal(err)
	}
}
