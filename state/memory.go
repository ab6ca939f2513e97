package state

import "sync"

// Memory is the in-memory [Store], the default: a map behind a
// read-write lock. It starts empty at checkpoint zero, so a newly opened
// one restores the whole changelog (a partition given back soon after it
// was taken keeps its store, and restores only the tail). Its heap per key is about
// 90 bytes plus the key's and the value's lengths (see the package doc).
type Memory struct {
	mu     sync.RWMutex
	kv     map[string]string
	cp     Checkpoint
	closed bool
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{kv: map[string]string{}}
}

// Get implements [Reader].
func (m *Memory) Get(key []byte) ([]byte, bool, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, false, ErrClosed
	}
	v, ok := m.kv[string(key)]
	if !ok {
		return nil, false, nil
	}
	return []byte(v), true, nil
}

// Range implements [Reader]; it holds the read lock throughout, so an
// Apply waits for it.
func (m *Memory) Range(fn func(key, value []byte) bool) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	for k, v := range m.kv {
		if !fn([]byte(k), []byte(v)) {
			return nil
		}
	}
	return nil
}

// Checkpoint implements [Reader].
func (m *Memory) Checkpoint() Checkpoint {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.cp
}

// Len returns how many keys the store holds.
func (m *Memory) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.kv)
}

// Apply implements [Store].
func (m *Memory) Apply(writes []Write, cp Checkpoint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if err := m.cp.CheckApply(cp); err != nil {
		return err
	}
	for _, w := range writes {
		if w.Value == nil {
			delete(m.kv, string(w.Key))
		} else {
			m.kv[string(w.Key)] = string(w.Value)
		}
	}
	m.cp = cp
	return nil
}

// Reset implements [Store].
func (m *Memory) Reset(cp Checkpoint) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.kv = map[string]string{}
	m.cp = cp
	return nil
}

// Close implements [Store]; it drops the keys.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.kv = nil
	return nil
}
