package window

import (
	"errors"
	"fmt"
	"time"
)

// ErrLate is wrapped by a [LateError].
var ErrLate = errors.New("late record")

// LateError is a record all of whose windows had closed when it came:
// it changed none of them. The windowed aggregations return it when asked
// to (so that the processor's error policy dead-letters it); it is the
// record's fault.
type LateError struct {
	// Time is the record's time; StreamTime its partition's stream time.
	Time, StreamTime time.Time
	// Window is the last window Time falls in, closed at StreamTime.
	Window Window
	// Grace is the spec's grace period.
	Grace time.Duration
	// Session, for a session aggregation, is the session the record
	// reaches, closed at StreamTime (Window is then unset).
	Session *Session
}

func (e *LateError) Error() string {
	if e.Session != nil {
		return fmt.Sprintf("%v: its time %s reaches the session %s, closed at stream time %s (grace %s)",
			ErrLate, e.Time.UTC().Format(time.RFC3339Nano), e.Session, e.StreamTime.UTC().Format(time.RFC3339Nano), e.Grace)
	}
	return fmt.Sprintf("%v: its time %s is past the grace period (%s) of its last window %s at stream time %s",
		ErrLate, e.Time.UTC().Format(time.RFC3339Nano), e.Grace, e.Window, e.StreamTime.UTC().Format(time.RFC3339Nano))
}

func (e *LateError) Unwrap() error { return ErrLate }

// ErrOutOfRange is returned by [Spec.Open] and [Spec.AppendOpen] for a
// time no window holds.
var ErrOutOfRange = errors.New("window: a time before the Unix epoch or after year 9999 falls in no window")

// Open returns the windows t falls in that are open at streamTime, a
// *[LateError] when none is, or [ErrOutOfRange]. s must be valid.
func (s Spec) Open(t, streamTime time.Time) ([]Window, error) {
	return s.AppendOpen(nil, t, streamTime)
}

// AppendOpen is [Spec.Open] appending the open windows to dst, and
// returning the extended slice (sharing dst's array while it has room):
// a caller handling many records gives the same, or a stack-allocated,
// slice, and allocates nothing for up to cap(dst) windows. It writes
// nothing past what it returns; on an error it returns dst as it was.
func (s Spec) AppendOpen(dst []Window, t, streamTime time.Time) ([]Window, error) {
	if !InRange(t) {
		return dst, ErrOutOfRange
	}
	ms := t.UnixMilli()
	size, adv := s.Size.Milliseconds(), s.advance().Milliseconds()
	// Closed, in whole milliseconds: a window is closed at streamTime when
	// streamTime's millisecond reaches its start + Size + Grace (a whole
	// millisecond; UnixMilli floors a time past the epoch, and before it
	// no window closes).
	closeFrom := streamTime.UnixMilli() - size - s.Grace.Milliseconds()
	last := ms - ms%adv // the latest start at or before t: t's last window
	from := len(dst)
	for start := max(0, last-(size-1)/adv*adv); start <= last; start += adv {
		if ms >= start+size {
			continue // ended before t
		}
		if start > closeFrom {
			dst = append(dst, s.window(start))
		}
	}
	if len(dst) == from {
		return dst, &LateError{Time: t, StreamTime: streamTime, Window: s.window(last), Grace: s.Grace}
	}
	return dst, nil
}
