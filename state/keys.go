package state

// KeyLister is a [KV] that can list its keys. A [Scope] is one.
type KeyLister interface {
	KV
	// Keys calls fn for each key that has a value, as the KV sees it,
	// until fn returns false; in no particular order. It reads the whole
	// committed store: its cost grows with the store.
	Keys(fn func(key []byte) bool) error
}

var _ KeyLister = (*Scope)(nil)

// Keys implements [KeyLister]: the committed store's keys, less those the
// transaction or the call deleted, with those they wrote. The slices are
// the caller's.
func (s *Scope) Keys(fn func(key []byte) bool) error {
	// The writes over the store: the call's over the transaction's.
	pending := map[string]bool{} // true: has a value
	s.txn.mu.RLock()
	for k, v := range s.txn.dirty {
		pending[k] = v != nil
	}
	s.txn.mu.RUnlock()
	s.mu.Lock()
	for _, w := range s.writes {
		pending[w.k] = w.v != nil
	}
	s.mu.Unlock()
	var stored [][]byte
	err := s.txn.store.Range(func(key, _ []byte) bool {
		if _, over := pending[string(key)]; !over {
			stored = append(stored, append([]byte(nil), key...))
		}
		return true
	})
	if err != nil {
		return err
	}
	// fn runs outside the store's Range: it may read the store.
	for _, k := range stored {
		if !fn(k) {
			return nil
		}
	}
	for k, has := range pending {
		if has && !fn([]byte(k)) {
			return nil
		}
	}
	return nil
}
