package eos

import (
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/eoskit/eoskit/state"
)

// streamTimeKey is where a windowed aggregation (and TTL) keeps its
// partition's stream time (Unix milliseconds, decimal text).
const streamTimeKey = state.ReservedPrefix + "stream-time"

// streamClock reads and moves a partition's stream time where its store
// keeps it (streamTimeKey). A handler makes one, so that reading it for
// each record makes no key; every partition and lane handled shares it,
// read only (stores and overlays copy or only read the keys they get).
//
// The stream time is read for every record; the partition's clockMemo
// (through the call's stateCtx) saves the read and the parse from the
// store for all but a partition's first record since an abort, a restore
// or the store's opening.
type streamClock []byte

func newStreamClock() streamClock { return streamClock(streamTimeKey) }

// move moves the stream time kv keeps to at truncated to the millisecond
// (the precision it is kept in), if that is later, and returns it as it
// was and as it is now; it writes kv only when it moves. call is the
// handler call's (nil outside a processor: kv is then read each time).
func (c streamClock) move(call *stateCtx, kv state.KV, at time.Time) (was, now time.Time, err error) {
	if was, err = c.read(call, kv); err != nil {
		return was, was, err
	}
	// Kept in milliseconds (Kafka's timestamps'): a later time within
	// the same millisecond moves nothing, and writes nothing.
	if now = at.Truncate(time.Millisecond); !now.After(was) {
		return was, was, nil
	}
	if err := kv.Put(c, strconv.AppendInt(nil, now.UnixMilli(), 10)); err != nil {
		return was, was, err
	}
	call.moved(now)
	return was, now, nil
}

// read returns the stream time kv keeps, the zero time before its
// partition's first record.
func (c streamClock) read(call *stateCtx, kv state.KV) (time.Time, error) {
	if t, ok := call.streamTime(); ok {
		return t, nil
	}
	v, ok, err := kv.Get(c)
	if err != nil {
		return time.Time{}, err
	}
	if !ok {
		call.learnedNone()
		return time.Time{}, nil
	}
	ms, err := state.Int64(v)
	if err != nil {
		return time.Time{}, fmt.Errorf("eos: the store's stream time %q: %w", v, err)
	}
	call.learned(ms)
	return time.UnixMilli(ms), nil
}

// clockMemo is a partition's stream time (and its tables' positions, see
// tablememo.go) as its transaction sees it (the transaction's kept writes
// over the store), remembered so that a record need not read it from the
// store; its owner forgets it whenever the transaction's writes are
// dropped (an abort) or the store is written otherwise (a restore). A
// handler call's own move is held apart until the runner keeps the
// call's writes (stateCtx.kept): a record that fails leaves the memo as
// the transaction is.
//
// Only one handler call at a time uses a partition's memo: the
// aggregations that keep stream time, and JoinTable, refuse KeyOrder
// lanes.
type clockMemo struct {
	// at is 0 when unknown (read the store), else encoded (see memoOf).
	at atomic.Int64
	// earliest is a lower bound of the window starts the store holds (0:
	// unknown; see windowbound.go).
	earliest atomic.Int64
	// tables are the positions of the co-partitioned tables the
	// partition's records join (see tablememo.go).
	tables tablePositions
	// scratch is a buffer the calls borrow for a key they build and let
	// go (see stateCtx.borrowScratch).
	scratch atomic.Pointer[[]byte]
}

// borrowScratch returns an empty buffer of capacity n or more for a key
// the call builds and lets go before it returns (a window's: a Scope and
// its Txn copy the keys they keep), which the call gives back
// (giveBackScratch): the partition memo's, taken from it, so that a call
// that finds it lent (a handler's goroutine still running after its call
// returned) gets a buffer of its own, as a call outside a processor does.
func (c *stateCtx) borrowScratch(n int) *[]byte {
	if c != nil && c.memo != nil {
		if b := c.memo.scratch.Swap(nil); b != nil {
			if cap(*b) < n {
				*b = make([]byte, 0, max(n, 64))
			}
			*b = (*b)[:0]
			return b
		}
	}
	b := make([]byte, 0, max(n, 64))
	return &b
}

// giveBackScratch gives back what borrowScratch lent, holding buf (the
// buffer, perhaps grown).
func (c *stateCtx) giveBackScratch(b *[]byte, buf []byte) {
	if c != nil && c.memo != nil && cap(buf) <= maxScratch {
		*b = buf[:0]
		c.memo.scratch.Store(b)
	}
}

// maxScratch is the largest buffer a memo keeps for its calls' keys: one
// grown by a key larger than most lives only as long as its call.
const maxScratch = 4 << 10

// noStreamTime is what a memo holds (encoded) for a partition that has
// no stream time yet.
const noStreamTime = 1

// memoOf encodes a stream time in Unix milliseconds for clockMemo.at: 0
// is unknown, noStreamTime none. ok is false for a time before the epoch
// (the aggregations refuse those), which is then not remembered.
func memoOf(ms int64) (int64, bool) {
	if ms < 0 || ms > math.MaxInt64-2 {
		return 0, false
	}
	return ms + 2, true
}

// forget makes the next read go to the store, and the next expiry point
// sweep (m nil: nothing to forget).
func (m *clockMemo) forget() {
	if m != nil {
		m.at.Store(0)
		m.earliest.Store(0)
		for i := range m.tables {
			m.tables[i].Store(0)
		}
	}
}

// streamTime returns what the call moved the stream time to, else what
// the partition's memo holds; ok is false when neither is known.
func (c *stateCtx) streamTime() (time.Time, bool) {
	if c == nil {
		return time.Time{}, false
	}
	enc := c.movedTo
	if enc == 0 && c.memo != nil {
		enc = c.memo.at.Load()
	}
	switch enc {
	case 0:
		return time.Time{}, false
	case noStreamTime:
		return time.Time{}, true
	}
	return time.UnixMilli(enc - 2), true
}

// learned remembers what the call read from the transaction (before any
// write of its own: reads see the call's move first).
func (c *stateCtx) learned(ms int64) {
	if enc, ok := memoOf(ms); ok {
		c.remember(enc)
	}
}

// learnedNone remembers that the transaction holds no stream time.
func (c *stateCtx) learnedNone() { c.remember(noStreamTime) }

func (c *stateCtx) remember(enc int64) {
	if c != nil && c.memo != nil && c.movedTo == 0 {
		c.memo.at.Store(enc)
	}
}

// moved notes that the call wrote the stream time t.
func (c *stateCtx) moved(t time.Time) {
	if c == nil {
		return
	}
	enc, ok := memoOf(t.UnixMilli())
	if !ok {
		// Before the epoch (the aggregations refuse such times): the
		// call's reads go to its KV, which holds the write, and the
		// partition's memo forgets.
		c.memo.forget()
		c.memo = nil
		return
	}
	c.movedTo = enc
}

// keep keeps a withScope call's writes: its Scope's into the transaction,
// then its moves and sweep bound into the memo (kept).
func (c *stateCtx) keep() {
	c.scope.Keep()
	c.kept()
}

// kept is called when the call's writes were kept: the memo takes the
// call's move, and its sweep's bound, as the transaction just did.
func (c *stateCtx) kept() {
	if c == nil || c.memo == nil {
		return
	}
	if c.movedTo != 0 {
		c.memo.at.Store(c.movedTo)
	}
	if c.sweptTo != 0 {
		c.memo.earliest.Store(c.sweptTo)
	}
	for i, enc := range c.tablesMoved {
		if enc != 0 {
			c.memo.tables[i].Store(enc)
		}
	}
}
