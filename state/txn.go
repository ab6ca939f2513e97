package state

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

// KV is the state of one partition as a handler sees it inside the
// transaction under way: the committed state with this transaction's own
// writes over it. What a handler writes becomes visible to other readers
// (a [Reader], another instance after a rebalance) only if the transaction
// commits; after an abort it is as if it had never been written.
type KV interface {
	// Get returns key's value as this transaction sees it, and whether
	// it has one. The slice returned is the caller's; key is only read,
	// during the call.
	Get(key []byte) (value []byte, ok bool, err error)
	// Put sets key's value; a nil value sets an empty one (only Delete
	// deletes). Key and value are copied. A key and value too large for
	// the changelog fail with an error wrapping [ErrTooLarge].
	Put(key, value []byte) error
	// Delete deletes key: its changelog record is a tombstone. Key is
	// copied.
	Delete(key []byte) error
}

// RecordOverhead is what [Txn] adds to a key's and a value's lengths to
// bound the size of their changelog record, batch framing included: a
// record batch's header is 61 bytes, a record's own fields (lengths,
// timestamp and offset deltas, attributes) at most about 30.
const RecordOverhead = 100

// Txn is one partition's [KV] for one transaction at a time: an overlay
// of the transaction's writes (each key's latest) over a [Store]. It is
// what a runner holds; the handler gets only its KV side. Get, Put and
// Delete are safe for concurrent use (lanes handling different keys of
// one partition at once); Dirty, Commit and Abort belong to whoever ends
// the transaction, once the handlers are done.
//
// The changelog records of a transaction are [Txn.Dirty]: one per key
// changed, with its final value, however often the handlers wrote it.
// The runner produces them in the transaction, to the changelog partition
// of the same number as the input's; once the transaction committed it
// calls [Txn.Commit] with the offset just past the last of them, which
// applies them to the store; after an abort (or a commit whose outcome is
// unknown) it calls [Txn.Abort], and the store is left as the last
// committed transaction left it. A Txn is used again for the next
// transaction after either.
type Txn struct {
	store Store

	// max is the changelog record's limit (0: none): atomic, read by
	// every write without the lock.
	max   atomic.Int64
	mu    sync.RWMutex
	dirty map[string][]byte // nil: deleted
}

var _ KV = (*Txn)(nil)

// NewTxn returns a Txn over s, refusing writes whose changelog record
// would exceed maxRecordBytes (the changelog's max.message.bytes, and at
// most the producer's batch limit for it; 0: no limit).
func NewTxn(s Store, maxRecordBytes int) *Txn {
	t := &Txn{store: s, dirty: map[string][]byte{}}
	t.max.Store(int64(maxRecordBytes))
	return t
}

// SetMaxRecordBytes changes the limit NewTxn set, for the writes to come:
// a runner that finds its producer's hooks add headers to every record
// (kotel's traceparent) lowers it by what they add.
func (t *Txn) SetMaxRecordBytes(maxRecordBytes int) {
	t.max.Store(int64(maxRecordBytes))
}

// Store returns the store under the overlay: the committed state.
func (t *Txn) Store() Store { return t.store }

// Get implements [KV]: the transaction's own write of key if there is
// one, else the store's value.
func (t *Txn) Get(key []byte) ([]byte, bool, error) {
	if v, found := t.own(key); found {
		if v == nil {
			return nil, false, nil
		}
		return bytes.Clone(v), true, nil
	}
	return t.store.Get(key)
}

// peek is Get without the copy of a value the transaction wrote, for
// this package's aggregates (Scope.add), which read the value and let it
// go. A value a Scope or its Txn holds is never written in place (every
// write is a slice of its own), so what peek returns stays as it is
// after the locks are let go; the store's value is its own copy.
func (t *Txn) peek(key []byte) ([]byte, bool, error) {
	if v, found := t.own(key); found {
		return v, v != nil, nil
	}
	return t.store.Get(key)
}

// own returns the transaction's write of key (nil: deleted), if it
// wrote key.
func (t *Txn) own(key []byte) (v []byte, found bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	v, found = t.dirty[string(key)]
	return v, found
}

// Put implements [KV].
func (t *Txn) Put(key, value []byte) error {
	if err := t.fits(key, value); err != nil {
		return err
	}
	v := append([]byte{}, value...) // never nil: nil marks a deletion
	t.mu.Lock()
	t.dirty[string(key)] = v
	t.mu.Unlock()
	return nil
}

// Delete implements [KV].
func (t *Txn) Delete(key []byte) error {
	if err := t.fits(key, nil); err != nil {
		return err
	}
	t.mu.Lock()
	t.dirty[string(key)] = nil
	t.mu.Unlock()
	return nil
}

func (t *Txn) fits(key, value []byte) error {
	if max := int(t.max.Load()); max > 0 && len(key)+len(value)+RecordOverhead > max {
		return fmt.Errorf("%w: a key of %d bytes and a value of %d bytes (+%d of framing) exceed the changelog's limit of %d bytes",
			ErrTooLarge, len(key), len(value), RecordOverhead, max)
	}
	return nil
}

// Len returns how many keys the transaction changed.
func (t *Txn) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.dirty)
}

// Dirty returns one [Write] per key the transaction changed, with its
// final value (nil: deleted), in key order: the changelog records to
// produce, and the one update per changed key an aggregation emits
// ([Updates]). The slices are copies.
func (t *Txn) Dirty() []Write {
	t.mu.RLock()
	defer t.mu.RUnlock()
	keys := slices.Sorted(maps.Keys(t.dirty))
	out := make([]Write, len(keys))
	for i, k := range keys {
		out[i] = Write{Key: []byte(k), Value: bytes.Clone(t.dirty[k])}
	}
	return out
}

// Commit applies the transaction's writes to the store with the
// checkpoint offset (one past the offset of the last changelog record
// the transaction produced), once the transaction committed in Kafka,
// and starts the next transaction empty. A transaction that wrote nothing
// applies nothing. If the store fails, the writes are kept and Commit
// may be called again; a runner that gives up must treat the store as
// behind its changelog: Abort, and restore the partition's tail before
// handling more of it.
func (t *Txn) Commit(offset int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.dirty) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(t.dirty))
	writes := make([]Write, len(keys))
	for i, k := range keys {
		writes[i] = Write{Key: []byte(k), Value: t.dirty[k]}
	}
	cp := t.store.Checkpoint()
	cp.Offset = offset
	if err := t.store.Apply(writes, cp); err != nil {
		return fmt.Errorf("state: apply the transaction's %d writes: %w", len(writes), err)
	}
	clear(t.dirty)
	return nil
}

// Abort drops the transaction's writes: nothing it wrote is visible
// afterwards, through this Txn or the store.
func (t *Txn) Abort() {
	t.mu.Lock()
	clear(t.dirty)
	t.mu.Unlock()
}
