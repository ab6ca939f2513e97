package state

import (
	"bytes"
	"sync"
)

// Scope is one handler call's [KV] inside a [Txn]: the call's writes over
// the transaction's, kept apart until the call is known to have
// succeeded. A runner keeps them ([Scope.Keep]) when the handler
// returned its outputs, and drops them ([Scope.Drop]) when it failed, so
// that a record sent to a dead-letter topic, or handled again after a
// panic, leaves no write of its own in the transaction that goes on
// without it.
//
// A Scope belongs to one handler call (one goroutine at a time); the Txn
// under it may be shared by lanes handling other keys.
type Scope struct {
	txn *Txn
	mu  sync.Mutex
	// writes are the call's writes, each key once, in the order first
	// written: a handler mostly writes few keys, so a slice searched from
	// its end costs less than a map made for every call; past
	// indexAbove writes (a windowed aggregation deleting the windows
	// that expired), index finds them.
	writes []scopeWrite
	index  map[string]int
	// buf holds the first writes, so that a call writing a key or two
	// (a count, a window and the stream time) allocates no slice.
	buf [3]scopeWrite
}

// indexAbove is how many writes a Scope searches before it indexes them.
const indexAbove = 16

// scopeWrite is one key's write in a Scope (v nil: deleted).
type scopeWrite struct {
	k string
	v []byte
}

// find returns the index of key's write in s, or -1; s.mu is held. It
// takes the key as bytes: a conversion to a string at each call would
// allocate for a key of more than 32 bytes (a table's keys), where the
// map index and the comparisons below do not.
func (s *Scope) find(key []byte) int {
	if s.index != nil {
		if i, ok := s.index[string(key)]; ok {
			return i
		}
		return -1
	}
	for i := len(s.writes) - 1; i >= 0; i-- {
		if s.writes[i].k == string(key) {
			return i
		}
	}
	return -1
}

var _ KV = (*Scope)(nil)

// Scope returns an empty Scope over t.
func (t *Txn) Scope() *Scope {
	s := new(Scope)
	t.InitScope(s)
	return s
}

// InitScope makes *s an empty Scope over t, as [Txn.Scope] returns one,
// in memory the caller provides: a runner keeping each call's Scope
// inside a value of its own makes one allocation a call instead of two.
// s must not be in use (a zero Scope, or one kept or dropped).
func (t *Txn) InitScope(s *Scope) {
	s.txn = t
	s.writes, s.index = s.buf[:0], nil
}

// Get implements [KV]: the call's own write of key, else the
// transaction's view.
func (s *Scope) Get(key []byte) ([]byte, bool, error) {
	if v, found := s.own(key); found {
		if v == nil {
			return nil, false, nil
		}
		return bytes.Clone(v), true, nil
	}
	return s.txn.Get(key)
}

// add is [Sum] in s, in one pass under its lock: the sum is parsed from
// the call's own write of key, else from the transaction's value, without
// copying either, and the new sum is handed over.
func (s *Scope) add(key []byte, n int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.find(key)
	var old []byte
	if i >= 0 {
		old = s.writes[i].v
	} else {
		var err error
		if old, _, err = s.txn.peek(key); err != nil {
			return 0, err
		}
	}
	sum, err := AddInt64(old, n)
	if err != nil {
		return 0, sumError(key, err)
	}
	v := AppendInt64(nil, sum)
	if err := s.txn.fits(key, v); err != nil {
		return sum, err
	}
	s.setLocked(i, key, v)
	return sum, nil
}

// own returns the call's own write of key (nil: deleted), if it wrote
// key.
func (s *Scope) own(key []byte) (v []byte, found bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.find(key); i >= 0 {
		return s.writes[i].v, true
	}
	return nil, false
}

// Put implements [KV]. A key and value too large for the changelog fail
// here, with an error wrapping [ErrTooLarge]: the record's fault.
func (s *Scope) Put(key, value []byte) error {
	return s.putOwned(key, append([]byte{}, value...))
}

// putOwned is Put of a value the caller hands over (and writes no
// more): s keeps it without a copy.
func (s *Scope) putOwned(key, value []byte) error {
	if err := s.txn.fits(key, value); err != nil {
		return err
	}
	s.set(key, value)
	return nil
}

// Delete implements [KV].
func (s *Scope) Delete(key []byte) error {
	if err := s.txn.fits(key, nil); err != nil {
		return err
	}
	s.set(key, nil)
	return nil
}

func (s *Scope) set(key, v []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setLocked(s.find(key), key, v)
}

// setLocked writes v at key, whose write is at index i (-1: none yet);
// s.mu is held.
func (s *Scope) setLocked(i int, key, v []byte) {
	if i >= 0 {
		s.writes[i].v = v
		return
	}
	s.writes = append(s.writes, scopeWrite{k: string(key), v: v})
	switch {
	case s.index != nil:
		s.index[string(key)] = len(s.writes) - 1
	case len(s.writes) > indexAbove:
		s.index = make(map[string]int, 2*len(s.writes))
		for i, w := range s.writes {
			s.index[w.k] = i
		}
	}
}

// Keep moves the call's writes into the transaction, and empties s.
func (s *Scope) Keep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.writes) == 0 {
		return
	}
	s.txn.mu.Lock()
	for _, w := range s.writes {
		s.txn.dirty[w.k] = w.v
	}
	s.txn.mu.Unlock()
	s.reset()
}

// Drop discards the call's writes: the transaction is as before the
// call.
func (s *Scope) Drop() {
	s.mu.Lock()
	s.reset()
	s.mu.Unlock()
}

// reset empties s, back to its inline writes (a larger slice, grown by
// a call that wrote many keys, is let go); s.mu is held.
func (s *Scope) reset() {
	clear(s.buf[:]) // the values are the transaction's now, or dropped
	s.writes, s.index = s.buf[:0], nil
}
