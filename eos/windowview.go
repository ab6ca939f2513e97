package eos

import (
	"errors"
	"time"

	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/window"
)

// WindowValue is one window of a key and its committed aggregate.
type WindowValue struct {
	Window window.Window
	Value  []byte
}

// maxWindowsQueried bounds what one [StateView.Windows] call reads.
const maxWindowsQueried = 100_000

// ErrNotHeld is what the [StateView]'s reads of a partition wrap (in a
// *[NotHeldError]) when this instance does not hold it, or restores it:
// their answer would be empty, not true.
var ErrNotHeld = errors.New("eos: the partition's state is not held here, or is restoring")

// Windows returns the committed windows of key in partition's store that
// a windowed aggregation of spec (the same spec: the view cannot tell)
// keeps, those starting from from to to (both included), earliest first;
// windows without a value (never opened, or deleted as expired) are left
// out. A partition this instance does not hold, or is restoring, is a
// *[NotHeldError] (wrapping [ErrNotHeld]). A range of more than 100,000 window starts is an error.
// The processor's transactions wait while it reads: keep ranges short.
func (v *StateView) Windows(spec window.Spec, partition int32, key []byte, from, to time.Time) ([]WindowValue, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	starts, err := spec.Starts(from, to, maxWindowsQueried)
	if err != nil || state.IsReserved(key) {
		return nil, err
	}
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	ps, err := v.ks.heldLocked(partition)
	if err != nil {
		return nil, err
	}
	var out []WindowValue
	wkey := make([]byte, 0, len(key)+window.KeyLen)
	for _, start := range starts {
		wkey = window.AppendKey(wkey[:0], key, start)
		val, ok, err := ps.store.Get(wkey)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, WindowValue{Window: spec.Starting(start), Value: val})
		}
	}
	return out, nil
}

// SessionValue is one session of a key and its committed aggregate.
type SessionValue struct {
	Session window.Session
	Value   []byte
}

// Sessions returns the committed sessions of key in partition's store
// that a session aggregation keeps, those overlapping from to to (both
// included), earliest first. A partition this instance does not hold, or
// is restoring, is a *[NotHeldError] (wrapping [ErrNotHeld]). It reads the key's session index, so its
// cost grows with the key's sessions kept.
func (v *StateView) Sessions(partition int32, key []byte, from, to time.Time) ([]SessionValue, error) {
	if state.IsReserved(key) {
		return nil, nil
	}
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	ps, err := v.ks.heldLocked(partition)
	if err != nil {
		return nil, err
	}
	es, err := readSessions(storeKV{ps.store}, key)
	if err != nil {
		return nil, err
	}
	var out []SessionValue
	for _, e := range es {
		if e.s.End.Before(from) || e.s.Start.After(to) {
			continue
		}
		val, ok, err := ps.store.Get(window.AppendSessionKey(nil, key, e.s))
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, SessionValue{Session: e.s, Value: val})
		}
	}
	return out, nil
}

// storeKV reads a committed store as a state.KV (for readSessions); it
// writes nothing.
type storeKV struct{ s state.Store }

func (k storeKV) Get(key []byte) ([]byte, bool, error) { return k.s.Get(key) }
func (storeKV) Put([]byte, []byte) error               { return errReadOnly }
func (storeKV) Delete([]byte) error                    { return errReadOnly }

var errReadOnly = errors.New("eos: a state view is read-only")
