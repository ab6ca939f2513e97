package eos

import (
	"context"
	"slices"
	"time"

	"github.com/eoskit/eoskit/state"
)

// Standbys lists the partitions this instance keeps standbys of for
// others (see [Standbys]), caught up or not yet: readable here only as
// stale values, once caught up, with [StateView.StandbyLookup] and
// [StateView.StandbyScan].
func (v *StateView) Standbys() []int32 {
	v.ks.mu.RLock()
	defer v.ks.mu.RUnlock()
	var ps []int32
	for p := range v.ks.standbys {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// StandbyLookup returns key's value in the standby store this instance
// keeps of the key's partition (see [Standbys]), and whether it has one
// there: a stale value, the owner's as its committed changelog held it
// when the standby's last successful catch-up began, at asOf (a
// catch-up runs every second; while they fail, asOf stays behind; and
// while a transaction its owner left open holds the changelog's last
// stable offset, what committed after it is missing, until the broker
// aborts it), and possibly part of the owner's next transaction (a
// catch-up applies fetch by fetch). It is for a reader that would rather have an old
// value than none, when the owner cannot answer: it is gone and the
// group has not moved its partitions yet, or it cannot be reached.
// Never take it for the current value: the owner may have committed
// many since. A partition
// this instance keeps no standby of, or none caught up yet, is a
// *[NotHeldError] (wrapping [ErrNotHeld]); a read waiting for a
// catch-up under way gives up when ctx ends, with its error. A reserved
// key ([state.ReservedPrefix]) has no value.
func (v *StateView) StandbyLookup(ctx context.Context, key []byte) (value []byte, found bool, asOf time.Time, err error) {
	p, err := v.PartitionOf(key)
	if err != nil {
		return nil, false, time.Time{}, err
	}
	if state.IsReserved(key) {
		return nil, false, time.Time{}, nil
	}
	asOf, err = v.ks.readStandby(ctx, p, func(s state.Reader) (err error) {
		value, found, err = s.Get(key)
		return err
	})
	return value, found, asOf, err
}

// StandbyScan is [StateView.ScanPartition] of the standby store this
// instance keeps of partition: fn gets its keys from start (inclusive;
// nil: the first) to end (exclusive; nil: past the last), in key order,
// until it returns false, as [StateView.StandbyLookup] says: stale, as
// of asOf, possibly with part of the owner's next transaction, a *[NotHeldError] without a standby caught up, ctx's error
// when a catch-up's write under way outlasts it. The standby's
// catch-up, and a restore taking the partition over here, wait while fn
// runs: keep it short, and call neither the view nor the processor from
// it.
func (v *StateView) StandbyScan(ctx context.Context, partition int32, start, end []byte, fn func(key, value []byte) bool) (asOf time.Time, err error) {
	return v.ks.readStandby(ctx, partition, func(s state.Reader) error {
		return state.Scan(s, start, end, func(k, val []byte) bool {
			return state.IsReserved(k) || fn(k, val)
		})
	})
}

// readStandby calls read on p's standby store, once caught up, with its
// turn held (no catch-up, takeover or close meanwhile), and returns when
// its last catch-up ended.
func (ks *keyedState) readStandby(ctx context.Context, p int32, read func(state.Reader) error) (time.Time, error) {
	ks.mu.RLock()
	sb := ks.standbys[p]
	ks.mu.RUnlock()
	if sb == nil {
		return time.Time{}, &NotHeldError{Partition: p}
	}
	if err := sb.lockCtx(ctx); err != nil {
		return time.Time{}, err
	}
	defer sb.unlock()
	ks.mu.RLock()
	// Taken over, or dropped, while this read waited: the store is
	// another's now, or closed; or not opened, or wiped since its last
	// catch-up.
	current, asOf := ks.standbys[p] == sb && !sb.gone && sb.store != nil, sb.caughtAt
	ks.mu.RUnlock()
	if !current || asOf.IsZero() {
		return time.Time{}, &NotHeldError{Partition: p}
	}
	return asOf, read(sb.store)
}
