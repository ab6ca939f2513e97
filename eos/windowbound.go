package eos

import (
	"math"
	"time"

	"github.com/eoskit/eoskit/window"
)

// A windowed aggregation's expiry sweep (see sweep) reads every key of
// its partition's store. It runs each time stream time passes an expiry
// point (a window start plus Retention: every Advance of stream time),
// though nothing may have expired yet (the first Retention of stream
// time, or a gap in the windows). So a partition's clockMemo also keeps
// a lower bound of the starts of the windows its store holds, as its
// transaction sees them: while the bound plus Retention is past the
// stream time, no window can have expired, and the sweep is left out. (A
// sweep a window's close calls for, under EmitFinal, still runs; once
// windows expire at every point, each point still reads the store.)
//
// A sweep learns the bound (the earliest start it leaves). A window a
// record writes lowers it at once: a lower bound stays one whatever
// becomes of the call. A sweep's bound, higher, is taken only when the
// runner keeps the call that swept (stateCtx.kept): a dropped call's
// deletions are gone with it. The bound is forgotten with the stream
// time (an abort, a restore), and the next expiry point sweeps.

// Encodings of clockMemo.earliest: 0 is unknown.
const (
	// noWindows: the store holds no window.
	noWindows = math.MaxInt64
	// boundOffset is added to a window start's Unix milliseconds, so
	// that none encodes as 0 (starts are far from ±2^62 ms).
	boundOffset = 1 << 62
)

func boundOf(start time.Time) int64 { return start.UnixMilli() + boundOffset }

// wrote lowers the partition's bound to a window start the call wrote.
func (c *stateCtx) wrote(start time.Time) {
	if c == nil || c.memo == nil {
		return
	}
	enc := boundOf(start)
	if c.sweptTo != 0 {
		c.sweptTo = min(c.sweptTo, enc)
	}
	if old := c.memo.earliest.Load(); old != 0 && enc < old {
		c.memo.earliest.Store(enc)
	}
}

// expiresNothing reports whether no window of the partition's store can
// have expired at now: its bound is known and is, plus the retention,
// past now.
func (c *stateCtx) expiresNothing(spec window.Spec, now time.Time) bool {
	if c == nil || c.memo == nil {
		return false
	}
	switch enc := c.memo.earliest.Load(); enc {
	case 0:
		return false
	case noWindows:
		return true
	default:
		return !spec.Expired(spec.Starting(time.UnixMilli(enc-boundOffset)), now)
	}
}

// swept notes the earliest start a sweep left (the zero time: none), for
// kept to make the partition's bound.
func (c *stateCtx) swept(earliest time.Time) {
	if c == nil {
		return
	}
	if earliest.IsZero() {
		c.sweptTo = noWindows
		return
	}
	c.sweptTo = boundOf(earliest)
}
