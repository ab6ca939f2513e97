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
	txn    *Txn
	mu     sync.Mutex
	writes map[string][]byte // nil: deleted
	order  []string          // keys in the order first written
}

var _ KV = (*Scope)(nil)

// Scope returns an empty Scope over t.
func (t *Txn) Scope() *Scope { return &Scope{txn: t} }

// Get implements [KV]: the call's own write of key, else the
// transaction's view.
func (s *Scope) Get(key []byte) ([]byte, bool, error) {
	s.mu.Lock()
	v, ok := s.writes[string(key)]
	s.mu.Unlock()
	if ok {
		if v == nil {
			return nil, false, nil
		}
		return bytes.Clone(v), true, nil
	}
	return s.txn.Get(key)
}

// Put implements [KV]. A key and value too large for the changelog fail
// here, with an error wrapping [ErrTooLarge]: the record's fault.
func (s *Scope) Put(key, value []byte) error {
	if err := s.txn.fits(key, value); err != nil {
		return err
	}
	s.set(key, append([]byte{}, value...))
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
	if s.writes == nil {
		s.writes = map[string][]byte{}
	}
	k := string(key)
	if _, ok := s.writes[k]; !ok {
		s.order = append(s.order, k)
	}
	s.writes[k] = v
}

// Keep moves the call's writes into the transaction, and empties s.
func (s *Scope) Keep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.writes) == 0 {
		return
	}
	s.txn.mu.Lock()
	for _, k := range s.order {
		s.txn.dirty[k] = s.writes[k]
	}
	s.txn.mu.Unlock()
	s.writes, s.order = nil, nil
}

// Drop discards the call's writes: the transaction is as before the
// call.
func (s *Scope) Drop() {
	s.mu.Lock()
	s.writes, s.order = nil, nil
	s.mu.Unlock()
}
