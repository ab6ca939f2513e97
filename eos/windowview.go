package eos

import (
	"errors"
	"fmt"
	"time"

	"github.com/eoskit/eoskit/window"
)

// WindowValue is one window of a key and its committed aggregate.
type WindowValue struct {
	Window window.Window
	Value  []byte
}

// maxWindowsQueried bounds what one [StateView.Windows] call reads.
const maxWindowsQueried = 100_000

// ErrNotHeld is returned by [StateView.Windows] for a partition this
// instance does not hold, or is restoring: its answer would be empty, not
// true.
var ErrNotHeld = errors.New("eos: the partition's state is not held here, or is restoring")

// Windows returns the committed windows of key in partition's store that
// a windowed aggregation of spec (the same spec: the view cannot tell)
// keeps, those starting from from to to (both included), earliest first;
// windows without a value (never opened, or deleted as expired) are left
// out. A partition this instance does not hold, or is restoring, is
// [ErrNotHeld]. A range of more than 100,000 window starts is an error.
// The processor's transactions wait while it reads: keep ranges short.
func (v *StateView) Windows(spec window.Spec, partition int32, key []byte, from, to time.Time) ([]WindowValue, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	starts, err := spec.Starts(from, to, maxWindowsQueried)
	if err != nil {
		return nil, err
	}
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	ps, ok := v.ks.parts[partition]
	if !ok || v.ks.restoring[partition] {
		return nil, fmt.Errorf("%w: partition %d", ErrNotHeld, partition)
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
