package window

import (
	"encoding/binary"
	"fmt"
	"time"
)

// Sessions says how a key's records group into sessions: records no more
// than Gap apart (by record time) are one session, which takes records
// until stream time passes its last record's time plus Gap plus Grace,
// and is kept Retention past its last record: Kafka Streams'
// SessionWindows.ofInactivityGapAndGrace(gap, grace). A record that
// falls within Gap of two sessions merges them into one. The zero value
// is invalid; [SessionsOf] makes a valid one.
type Sessions struct {
	// Gap is the longest quiet time inside a session (at least a
	// millisecond, whole milliseconds).
	Gap time.Duration
	// Grace is how long past its close a session still takes late
	// records, by stream time (default 0). Whole milliseconds.
	Grace time.Duration
	// Retention is how long past its last record a session is kept, by
	// stream time (default, and at least, 2 × Gap + Grace: until then a
	// record may still reach it, and is late; gone, it would open a
	// session beside one closed). Whole milliseconds.
	Retention time.Duration
}

// SessionsOf returns sessions of gap, taking records up to grace late.
func SessionsOf(gap, grace time.Duration) Sessions { return Sessions{Gap: gap, Grace: grace} }

// Session is one session: the times of its first and its last record,
// both included.
type Session struct {
	Start, End time.Time
}

func (ss Session) String() string {
	return fmt.Sprintf("[%s, %s]", ss.Start.UTC().Format(time.RFC3339Nano), ss.End.UTC().Format(time.RFC3339Nano))
}

// Validate returns an error wrapping [ErrSpec] naming what is wrong with
// s, or nil.
func (s Sessions) Validate() error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrSpec}, args...)...)
	}
	switch {
	case s.Gap < time.Millisecond || s.Gap%time.Millisecond != 0:
		return refuse("gap %s is not a positive whole number of milliseconds", s.Gap)
	case s.Gap > maxSpan || s.Grace > maxSpan || s.Retention > maxSpan:
		return refuse("gap, grace and retention are each at most a century")
	case s.Grace < 0 || s.Grace%time.Millisecond != 0:
		return refuse("grace %s is not a whole number of milliseconds from 0", s.Grace)
	case s.Retention%time.Millisecond != 0:
		return refuse("retention %s is not a whole number of milliseconds", s.Retention)
	case s.Retention != 0 && s.Retention < 2*s.Gap+s.Grace:
		return refuse("retention %s is less than twice the gap plus grace (%s): a session would leave the store while a record may still reach it", s.Retention, 2*s.Gap+s.Grace)
	}
	return nil
}

// retention is s.Retention, 2 × Gap + Grace when unset.
func (s Sessions) retention() time.Duration { return max(s.Retention, 2*s.Gap+s.Grace) }

// Reaches reports whether a record at t belongs with ss: t is within Gap
// of it (Kafka Streams finds a record's sessions from t - gap to t + gap).
func (s Sessions) Reaches(ss Session, t time.Time) bool {
	return !t.Before(ss.Start.Add(-s.Gap)) && !t.After(ss.End.Add(s.Gap))
}

// Closed reports whether ss takes no more records at streamTime: stream
// time has passed its end plus Gap plus Grace (Kafka Streams' rule: a
// session is closed once its end is before stream time - grace - gap).
func (s Sessions) Closed(ss Session, streamTime time.Time) bool {
	return streamTime.After(ss.End.Add(s.Gap + s.Grace))
}

// Expired reports whether ss leaves the store at streamTime: stream time
// has passed its end plus Retention. An expired session is closed.
func (s Sessions) Expired(ss Session, streamTime time.Time) bool {
	return streamTime.After(ss.End.Add(s.retention()))
}

// SessionKeyLen is what [AppendSessionKey] adds to a record's key.
const SessionKeyLen = 16

// AppendSessionKey appends to dst the key of key's session ss: key's
// bytes, then the session's end and its start in Unix milliseconds, each
// 8 bytes big-endian, as Kafka Streams' SessionKeySchema lays out a
// session's key.
func AppendSessionKey(dst, key []byte, ss Session) []byte {
	dst = append(dst, key...)
	dst = binary.BigEndian.AppendUint64(dst, uint64(ss.End.UnixMilli()))
	return binary.BigEndian.AppendUint64(dst, uint64(ss.Start.UnixMilli()))
}

// SplitSessionKey returns the record key and the session of a key
// [AppendSessionKey] made. The key returned shares b's memory.
func SplitSessionKey(b []byte) (key []byte, ss Session, err error) {
	if len(b) < SessionKeyLen {
		return nil, Session{}, fmt.Errorf("window: a session's key is at least %d bytes", SessionKeyLen)
	}
	n := len(b) - SessionKeyLen
	end := time.UnixMilli(int64(binary.BigEndian.Uint64(b[n:])))
	start := time.UnixMilli(int64(binary.BigEndian.Uint64(b[n+8:])))
	return b[:n:n], Session{Start: start, End: end}, nil
}
