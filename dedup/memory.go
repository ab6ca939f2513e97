package dedup

import "sync"

// MemoryStore remembers the last N claimed ids per process, for pipelines
// where a process-local window is enough: it catches the copies a producer
// retry or a rebalance redelivers a moment later, nothing more.
//
// It is weaker than [PostgresStore] in three ways, each a way to apply a
// message twice: it forgets everything on restart; an id older than the
// last N claims is forgotten; and a claim is not atomic with the side
// effect (a crash after the claim and before the effect loses the message's
// effect, since the id is remembered; a crash after the effect and before
// the claim applies it again on redelivery). Use it only where those cases
// are acceptable.
type MemoryStore struct {
	mu     sync.Mutex
	window int
	seen   map[string]struct{}
	ring   []string // claimed keys in claim order; ring[next] is the oldest once full
	next   int
}

// NewMemoryStore returns a store that remembers the last window ids
// (window must be positive).
func NewMemoryStore(window int) *MemoryStore {
	if window <= 0 {
		window = 1
	}
	return &MemoryStore{window: window, seen: make(map[string]struct{}, window), ring: make([]string, 0, window)}
}

// Claim reports whether id was not among the last window ids claimed in
// scope, and remembers it.
func (m *MemoryStore) Claim(scope, id string) bool {
	key := scope + "\x00" + id
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.seen[key]; ok {
		return false
	}
	if len(m.ring) < m.window {
		m.ring = append(m.ring, key)
	} else {
		delete(m.seen, m.ring[m.next])
		m.ring[m.next] = key
		m.next = (m.next + 1) % m.window
	}
	m.seen[key] = struct{}{}
	return true
}
