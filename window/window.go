package window

import (
	"errors"
	"fmt"
	"time"
)

// Spec says which windows a record time falls in, how long after its end
// a window still takes records, and how long it is kept. The zero Spec is
// invalid; [Tumbling] and [Hopping] make valid ones.
type Spec struct {
	// Size is each window's length (at least a millisecond, in whole
	// milliseconds: Kafka's timestamps are milliseconds).
	Size time.Duration
	// Advance is the distance between two windows' starts: Size (or 0)
	// for tumbling windows, less for hopping ones. Whole milliseconds.
	Advance time.Duration
	// Grace is how long past its end a window still takes late records,
	// by stream time (default 0: none). Whole milliseconds.
	Grace time.Duration
	// Retention is how long past its start a window is kept, by stream
	// time (default, and at least, Size + Grace). Whole milliseconds.
	Retention time.Duration
}

// Tumbling returns windows of size laid end to end, taking records up to
// grace after their end: Kafka Streams'
// TimeWindows.ofSizeAndGrace(size, grace).
func Tumbling(size, grace time.Duration) Spec {
	return Spec{Size: size, Advance: size, Grace: grace}
}

// Hopping returns windows of size starting every advance, taking records
// up to grace after their end: Kafka Streams'
// TimeWindows.ofSizeAndGrace(size, grace).advanceBy(advance).
func Hopping(size, advance, grace time.Duration) Spec {
	return Spec{Size: size, Advance: advance, Grace: grace}
}

// Window is one window: the times from Start (inclusive) to End
// (exclusive).
type Window struct {
	Start, End time.Time
}

func (w Window) String() string {
	return fmt.Sprintf("[%s, %s)", w.Start.UTC().Format(time.RFC3339Nano), w.End.UTC().Format(time.RFC3339Nano))
}

// ErrSpec is wrapped by what [Spec.Validate] returns.
var ErrSpec = errors.New("window: invalid spec")

// MaxTime is the latest time a window may hold: the end of year 9999.
// Later times (a Kafka timestamp may be up to 2^63-1 ms) are refused by
// the windowed aggregations, so that no window's arithmetic overflows.
var MaxTime = time.Unix(maxTimeUnix, maxTimeNanos).UTC()

// maxTimeUnix and maxTimeNanos are MaxTime's Unix seconds and nanoseconds
// (9999-12-31T23:59:59.999Z), which InRange compares with.
const (
	maxTimeUnix  = 253402300799
	maxTimeNanos = 999e6
)

// maxSpan bounds a spec's durations (a century each), so that size,
// grace and retention add up without overflow.
const maxSpan = 100 * 365 * 24 * time.Hour

// MaxWindowsPerRecord bounds the windows one record falls in (Size /
// Advance, rounded up), each a key its transaction writes: a day's
// windows advancing by the minute (1,440) pass; a century's advancing by
// the millisecond would have each record enumerate some 3e12.
const MaxWindowsPerRecord = 10_000

// Validate returns an error wrapping [ErrSpec] naming what is wrong with
// s, or nil.
func (s Spec) Validate() error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrSpec}, args...)...)
	}
	switch {
	case s.Size < time.Millisecond || s.Size%time.Millisecond != 0:
		return refuse("size %s is not a positive whole number of milliseconds", s.Size)
	case s.Size > maxSpan || s.Grace > maxSpan || s.Retention > maxSpan:
		return refuse("size, grace and retention are each at most a century")
	case s.Advance < 0 || s.Advance > s.Size || s.Advance%time.Millisecond != 0:
		return refuse("advance %s is not a whole number of milliseconds from 1 ms to the size %s", s.Advance, s.Size)
	case s.Advance > 0 && (s.Size+s.Advance-1)/s.Advance > MaxWindowsPerRecord:
		return refuse("size %s advancing by %s puts each record in %d windows, over %d", s.Size, s.Advance, (s.Size+s.Advance-1)/s.Advance, MaxWindowsPerRecord)
	case s.Grace < 0 || s.Grace%time.Millisecond != 0:
		return refuse("grace %s is not a whole number of milliseconds from 0", s.Grace)
	case s.Retention%time.Millisecond != 0:
		return refuse("retention %s is not a whole number of milliseconds", s.Retention)
	case s.Retention != 0 && s.Retention < s.Size+s.Grace:
		return refuse("retention %s is less than size + grace (%s): a window would leave the store while it still takes records", s.Retention, s.Size+s.Grace)
	}
	return nil
}

// advance is s.Advance, Size when unset.
func (s Spec) advance() time.Duration {
	if s.Advance == 0 {
		return s.Size
	}
	return s.Advance
}

// retention is s.Retention, Size + Grace when unset.
func (s Spec) retention() time.Duration {
	return max(s.Retention, s.Size+s.Grace)
}

// For returns the windows t falls in, earliest first: one for tumbling
// windows, up to Size/Advance (rounded up) for hopping ones. A time before
// the Unix epoch or after [MaxTime] falls in none. s must be valid.
func (s Spec) For(t time.Time) []Window {
	// At a stream time before the epoch every window is open.
	ws, _ := s.AppendOpen(nil, t, time.Time{})
	return ws
}

// Starting returns the window that starts at start (a multiple of
// Advance since the epoch).
func (s Spec) Starting(start time.Time) Window {
	return s.window(start.UnixMilli())
}

func (s Spec) window(startMs int64) Window {
	start := time.UnixMilli(startMs)
	return Window{Start: start, End: start.Add(s.Size)}
}

// Closed reports whether w takes no more records at streamTime: stream
// time has reached its end plus Grace (Kafka Streams' rule: a window
// takes a record while stream time - grace is before its end).
func (s Spec) Closed(w Window, streamTime time.Time) bool {
	return !streamTime.Before(w.End.Add(s.Grace))
}

// Expired reports whether w leaves the store at streamTime: stream time
// has reached its start plus Retention. An expired window is closed.
func (s Spec) Expired(w Window, streamTime time.Time) bool {
	return !streamTime.Before(w.Start.Add(s.retention()))
}

// Starts returns the starts of the windows that begin from from to to
// (both included), earliest first, at most limit of them; more is an
// error. s must be valid.
func (s Spec) Starts(from, to time.Time, limit int) ([]time.Time, error) {
	adv := s.advance().Milliseconds()
	if from.Before(time.UnixMilli(0)) {
		from = time.UnixMilli(0)
	}
	if to.After(MaxTime) {
		to = MaxTime
	}
	if from.After(to) {
		return nil, nil
	}
	lo, hi := from.UnixMilli(), to.UnixMilli()
	first := lo + (adv-lo%adv)%adv
	if hi < first {
		return nil, nil
	}
	if n := (hi-first)/adv + 1; n > int64(limit) {
		return nil, fmt.Errorf("window: %d windows start from %s to %s, more than %d", n, from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339), limit)
	}
	var starts []time.Time
	for ms := first; ms <= hi; ms += adv {
		starts = append(starts, time.UnixMilli(ms))
	}
	return starts, nil
}

// InRange reports whether t is a time windows hold: from the Unix epoch
// to [MaxTime].
func InRange(t time.Time) bool {
	// In seconds and nanoseconds (Unix floors: -1 before the epoch), as
	// t.After(MaxTime) compares, without its monotonic clock's checks:
	// every record of a windowed aggregation comes here twice.
	sec := t.Unix()
	return sec >= 0 && (sec < maxTimeUnix || sec == maxTimeUnix && t.Nanosecond() <= maxTimeNanos)
}

// ExpiresBetween reports whether a window may expire as stream time moves
// from was (exclusive) to now (inclusive): whether a window start plus
// Retention lies in between. The zero was (no stream time yet) says yes.
func (s Spec) ExpiresBetween(was, now time.Time) bool {
	if was.IsZero() && now.After(was) {
		return true
	}
	return s.pointBetween(was, now, s.retention())
}

// ClosesBetween reports whether a window may close as stream time moves
// from was (exclusive) to now (inclusive): whether a window start plus
// Size plus Grace lies in between. The zero was (no stream time yet) says
// yes.
func (s Spec) ClosesBetween(was, now time.Time) bool {
	if was.IsZero() && now.After(was) {
		return true
	}
	return s.pointBetween(was, now, s.Size+s.Grace)
}

// pointBetween reports whether a window start plus offset lies in
// (was, now].
func (s Spec) pointBetween(was, now time.Time, offset time.Duration) bool {
	if !now.After(was) {
		return false
	}
	adv, off := s.advance().Milliseconds(), offset.Milliseconds()
	// The points are k*adv + off: count those at or before each time.
	return floorDiv(now.UnixMilli()-off, adv) > floorDiv(was.UnixMilli()-off, adv)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
