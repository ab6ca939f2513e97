package eos

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/eoskit/eoskit/state"
)

// StateView is a read-only view of a stateful processor's committed state
// (see [Changelog]): the stores of the input partitions this instance
// holds, as the last committed transaction left them, never a write of a
// transaction under way. It is safe to use from other goroutines (an HTTP
// handler) while Run works; a partition being restored is not in it
// until its restore finished (see [Processor.Health]).
type StateView struct{ ks *keyedState }

// State returns the processor's [StateView], or nil when it was given no
// [Changelog].
func (p *Processor) State() *StateView {
	if p.state == nil {
		return nil
	}
	return &StateView{p.state}
}

// Partitions lists the input partitions whose state this instance holds,
// ready to read.
func (v *StateView) Partitions() []int32 {
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	var ps []int32
	for p := range v.ks.parts {
		if !v.ks.unreadyLocked(p) {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// Get returns key's committed value in partition's store, and whether it
// has one there; a partition this instance does not hold (or is
// restoring) has none, nor has a reserved key ([state.ReservedPrefix]).
func (v *StateView) Get(partition int32, key []byte) ([]byte, bool, error) {
	if state.IsReserved(key) {
		return nil, false, nil
	}
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	ps, ok := v.ks.parts[partition]
	if !ok || v.ks.unreadyLocked(partition) {
		return nil, false, nil
	}
	return ps.store.Get(key)
}

// Range calls fn on every committed key and value of the partitions this
// instance holds (but the reserved ones, see [state.ReservedPrefix]), partition by partition in order (within one, in key
// order for a pebble store, in no order for the memory store), until fn
// returns false. The slices are valid during the call only. The
// processor's transactions wait while it runs: keep fn short, and call
// neither the view nor the processor from it (copy what you need).
func (v *StateView) Range(fn func(partition int32, key, value []byte) bool) error {
	return v.each(func(s state.Reader, f func(k, v []byte) bool) error { return s.Range(f) }, fn)
}

// each calls read on the store of every partition held ready, in
// partition order, passing fn what it reads but the reserved keys,
// until fn returns false.
func (v *StateView) each(read func(s state.Reader, f func(k, v []byte) bool) error, fn func(partition int32, key, value []byte) bool) error {
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	for _, p := range slices.Sorted(maps.Keys(v.ks.parts)) {
		if v.ks.unreadyLocked(p) {
			continue
		}
		more := true
		err := read(v.ks.parts[p].store, func(k, val []byte) bool {
			if state.IsReserved(k) {
				return true
			}
			more = fn(p, k, val)
			return more
		})
		if err != nil || !more {
			return err
		}
	}
	return nil
}

// Scan calls fn on the committed keys from start (inclusive; nil: the
// first) to end (exclusive; nil: past the last) and their values, of the
// partitions this instance holds ready (but the reserved keys, see
// [state.ReservedPrefix]), partition by partition in order, each in key
// order, until fn returns false. Keys are spread over partitions by
// their hash, so a range read from one instance holds its partitions'
// keys only: [StateView.Partitions] says which. A pebble store reads the
// range alone; the memory store is read whole for each partition (see
// [state.Scan]). The slices are valid during the call only. The
// processor's transactions wait while it runs: keep fn short, and call
// neither the view nor the processor from it.
func (v *StateView) Scan(start, end []byte, fn func(partition int32, key, value []byte) bool) error {
	return v.each(func(s state.Reader, f func(k, v []byte) bool) error { return state.Scan(s, start, end, f) }, fn)
}

// ScanPartition is [StateView.Scan] of one partition: fn gets the
// committed keys of partition's store from start (inclusive; nil: the
// first) to end (exclusive; nil: past the last), in key order, until it
// returns false. A partition this instance does not hold, was revoked
// from it, or is restoring is a *[NotHeldError] (wrapping [ErrNotHeld]),
// before fn is called: never an empty answer that is not true. What
// [StateView.Scan] says of cost and of fn holds here.
func (v *StateView) ScanPartition(partition int32, start, end []byte, fn func(key, value []byte) bool) error {
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	ps, err := v.ks.heldLocked(partition)
	if err != nil {
		return err
	}
	return state.Scan(ps.store, start, end, func(k, val []byte) bool {
		return state.IsReserved(k) || fn(k, val)
	})
}

// Checkpoint returns where partition's committed state stands: its
// store's changelog checkpoint (the changelog's topic ID, and the next
// offset to read). It moves with each committed transaction that
// changed the partition's state, and only then (a restore reaches the
// changelog's end): a key for a cache of what is read from it
// (eoshttp.Cache). A partition this instance does not hold, was revoked
// from it, or is restoring is a *[NotHeldError], as for
// [StateView.ScanPartition].
func (v *StateView) Checkpoint(partition int32) (state.Checkpoint, error) {
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	ps, err := v.ks.heldLocked(partition)
	if err != nil {
		return state.Checkpoint{}, err
	}
	return ps.store.Checkpoint(), nil
}

// InputPartitions returns the input's partition count as Run found it: the
// partitions [StateView.ScanPartition] and [StateView.PartitionOwner]
// take, 0 to n-1. Before Run learnt it, it returns [ErrNotHeld].
func (v *StateView) InputPartitions() (int32, error) {
	n := v.ks.partitionCount()
	if n <= 0 {
		return 0, fmt.Errorf("%w: the processor has not read the input's partitions yet", ErrNotHeld)
	}
	return n, nil
}

// Prefix is [StateView.Scan] of the keys beginning with prefix.
func (v *StateView) Prefix(prefix []byte, fn func(partition int32, key, value []byte) bool) error {
	return v.Scan(prefix, state.PrefixEnd(prefix), fn)
}

// PartitionOf returns the input partition key's records are in, and its
// state with them: where the partitioner given to
// [RequireKeyPartitioning] puts key, else the processor's producer
// partitioner (franz-go's default: murmur2, as the Java client; or the
// one given in [ClientOptions]), over the input's partitions as Run found
// them. The input must be partitioned so. A nil key, or a partitioner
// that does not place records by key, is an error; before Run learnt
// the input's partition count, it returns [ErrNotHeld].
func (v *StateView) PartitionOf(key []byte) (int32, error) {
	if key == nil {
		return 0, errors.New("eos: a nil key has no partition")
	}
	n, err := v.InputPartitions()
	if err != nil {
		return 0, err
	}
	return v.ks.keys.partition(key, n)
}

// Lookup returns key's committed value, from the partition its records
// are in ([StateView.PartitionOf]), and whether it has one. A partition
// this instance does not hold, was revoked from it, or is restoring is a
// *[NotHeldError] (wrapping [ErrNotHeld]), not an absent key: an endpoint
// serving the view answers "ask elsewhere" or "not ready", never a wrong
// "none". A reserved key ([state.ReservedPrefix]) has no value.
func (v *StateView) Lookup(key []byte) ([]byte, bool, error) {
	p, err := v.PartitionOf(key)
	if err != nil {
		return nil, false, err
	}
	if state.IsReserved(key) {
		return nil, false, nil
	}
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	ps, err := v.ks.heldLocked(p)
	if err != nil {
		return nil, false, err
	}
	return ps.store.Get(key)
}

// NotHeldError is what [StateView.Lookup] returns for a key whose
// partition this instance cannot answer for: Restoring when it holds the
// partition and restores it (ask again soon), else another instance holds
// it, or none does yet. It wraps [ErrNotHeld].
type NotHeldError struct {
	Partition int32
	Restoring bool
}

func (e *NotHeldError) Error() string {
	if e.Restoring {
		return fmt.Sprintf("%v: partition %d is restoring", ErrNotHeld, e.Partition)
	}
	return fmt.Sprintf("%v: partition %d", ErrNotHeld, e.Partition)
}

func (e *NotHeldError) Unwrap() error { return ErrNotHeld }
