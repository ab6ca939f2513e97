package eos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/window"
)

// TTL deletes each key of the keyed state that no record has written for
// d of its partition's stream time (the largest record timestamp the
// processor has handled there with success, kept in the store as a windowed
// aggregation keeps it), so that a state whose keys keep coming (users,
// sessions, devices) stays bounded. The delete is a tombstone in the
// changelog, and in the [EmitUpdates] topic, in the transaction of the
// record whose time passed it. Default: none, keys are kept until
// deleted.
//
// A key is written when a handler Puts it (through [StateOf], or an
// aggregation: [Count], [Sum], [Reduce]); it expires once stream time
// reaches its last write's stream time plus d. From then on the handler
// no longer sees it (a count starts again from nothing). It leaves the
// store at the next sweep, run when stream time crosses a multiple of
// d/8, which reads every key: until then a [StateView] may still show it.
// A key already in the store when TTL is first given is stamped at the
// first sweep, and expires d after it.
//
// What it costs: one more key per key, in the store and the changelog
// (its write's time, under [state.ReservedPrefix]), written with it. What
// breaks it: stream time follows record timestamps, so a partition that
// receives no records expires nothing, and a record timestamped far
// ahead expires every key it passes (a Kafka 4 broker refuses timestamps
// more than message.timestamp.after.max.ms ahead, an hour by default);
// a record without a usable timestamp (none, -1; before the epoch; after
// [window.MaxTime]) is the record's fault. Running the processor without
// TTL for a while, then with it again, leaves the stamps of that while
// unwritten: a key written only meanwhile expires by its older stamp. A
// handler may not write reserved keys under TTL (the record's fault).
// The sweep reads every key of the partition's store in one record's
// handling, and the first sweep on a store of many keys without stamps
// writes one per key in that transaction. d must be whole milliseconds, at least one, at most a
// century (a *[eoskit.ConfigError] from NewProcessor), and TTL cannot be
// given under [KeyOrder] with [Concurrency] above 1 (stream time follows
// each partition's order) or to a windowed aggregation (windows expire
// by their spec's retention: Run returns a *[eoskit.ConfigError] at the
// first record).
func TTL(d time.Duration) StateOption {
	return stateOpt(func(c *stateConfig) { c.ttl, c.ttlSet = d, true })
}

// ttlPrefix is where TTL keeps each key's last write's stream time (Unix
// milliseconds, decimal text): ttlPrefix + key.
const ttlPrefix = state.ReservedPrefix + "ttl/"

// ttlSweeps is how many sweeps run per TTL of stream time: a key leaves
// the store at most TTL/ttlSweeps after it expired.
const ttlSweeps = 8

// validateTTL checks d as TTL takes it.
func validateTTL(d time.Duration) error {
	switch {
	case d < time.Millisecond || d%time.Millisecond != 0:
		return fmt.Errorf("%s is not a whole number of milliseconds, at least one", d)
	case d > 100*365*24*time.Hour:
		return fmt.Errorf("%s is more than a century", d)
	}
	return nil
}

// withTTL returns h run under a TTL of ttl: before h, it moves the
// partition's stream time to the record's, and sweeps when that crosses
// a sweep point; h sees the store through a ttlKV, which stamps what h
// writes and hides what expired.
func withTTL(h HandlerFunc, ttl time.Duration) HandlerFunc {
	every := max(ttl/ttlSweeps, time.Millisecond).Truncate(time.Millisecond).Milliseconds()
	clock := newStreamClock()
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		hs := handlerStateOf(ctx)
		kv := hs.kv
		if !window.InRange(r.Timestamp) {
			return nil, fmt.Errorf("eos: the record's timestamp %s, by which its state expires: %w", r.Timestamp.UTC().Format(time.RFC3339Nano), window.ErrOutOfRange)
		}
		was, now, err := clock.move(hs.call, kv, r.Timestamp)
		if err != nil {
			return nil, err
		}
		if crossed(was, now, every) {
			if err := sweepTTL(kv, now, ttl); err != nil {
				return nil, err
			}
		}
		ctx = withKV(ctx, &ttlKV{kv: kv, now: now, ttl: ttl}, &hs, nil)
		return h(ctx, r)
	}
}

// crossed reports whether stream time, moving from was to now, crossed a
// multiple of every milliseconds (or first moved: was zero). Times are
// past the epoch (window.InRange): a division floors.
func crossed(was, now time.Time, every int64) bool {
	return now.After(was) && (was.IsZero() || was.UnixMilli()/every != now.UnixMilli()/every)
}

// sweepTTL deletes, in kv, each key whose stamp expired at now, with its
// stamp; stamps each key without one (written before TTL was given); and
// deletes each stamp whose key is gone.
func sweepTTL(kv state.KV, now time.Time, ttl time.Duration) error {
	lister, ok := kv.(state.KeyLister)
	if !ok {
		return errNoKeys
	}
	keys, stamped := map[string]bool{}, map[string]bool{}
	if err := lister.Keys(func(key []byte) bool {
		switch {
		case bytes.HasPrefix(key, []byte(ttlPrefix)):
			stamped[string(key[len(ttlPrefix):])] = true
		case !state.IsReserved(key):
			keys[string(key)] = true
		}
		return true
	}); err != nil {
		return err
	}
	stamp := strconv.AppendInt(nil, now.UnixMilli(), 10)
	for key := range keys {
		if !stamped[key] {
			// A key too large for the changelog with its stamp's 12 more
			// bytes is not stamped, and never expires: not the fault of
			// the record under way.
			if err := kv.Put([]byte(ttlPrefix+key), stamp); err != nil && !errors.Is(err, state.ErrTooLarge) {
				return err
			}
		}
	}
	for key := range stamped {
		if !keys[key] { // its key is gone: the stamp alone
			if err := kv.Delete([]byte(ttlPrefix + key)); err != nil {
				return err
			}
			continue
		}
		expired, err := stampExpired(kv, []byte(key), now, ttl)
		if errors.Is(err, errBadStamp) { // stamped anew
			err = kv.Put([]byte(ttlPrefix+key), stamp)
		}
		if err != nil {
			return err
		}
		if expired {
			if err := kv.Delete([]byte(key)); err != nil {
				return err
			}
			if err := kv.Delete([]byte(ttlPrefix + key)); err != nil {
				return err
			}
		}
	}
	return nil
}

// errBadStamp is what stampExpired returns for a stamp that is not a
// time in range (eoskit never writes one).
var errBadStamp = errors.New("eos: a key's write time is not a time")

// stampExpired reports whether key's stamp in kv is ttl or more before
// now (false for a key without one).
func stampExpired(kv state.KV, key []byte, now time.Time, ttl time.Duration) (bool, error) {
	v, ok, err := kv.Get(append([]byte(ttlPrefix), key...))
	if err != nil || !ok {
		return false, err
	}
	ms, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || !window.InRange(time.UnixMilli(ms)) {
		return false, fmt.Errorf("%w: %q", errBadStamp, v)
	}
	return now.UnixMilli()-ms >= ttl.Milliseconds(), nil
}

// ttlKV is the store as a handler under TTL sees it: a key that expired
// is not there, and each write stamps its key with the stream time.
type ttlKV struct {
	kv  state.KV
	now time.Time
	ttl time.Duration
}

var _ state.KeyLister = (*ttlKV)(nil)

// errReservedTTL is what a handler under TTL gets for a write of a
// reserved key: eoskit keeps its stream time and write times there.
var errReservedTTL = fmt.Errorf("eos: under TTL, a handler may not write keys beginning with %q (state.ReservedPrefix)", state.ReservedPrefix)

// Get implements [state.KV]: nothing for a reserved key, or one expired.
// A stamp that is not a time counts as not expired (the next sweep
// stamps it anew).
func (t *ttlKV) Get(key []byte) ([]byte, bool, error) {
	if state.IsReserved(key) {
		return nil, false, nil
	}
	v, ok, err := t.kv.Get(key)
	if err != nil || !ok {
		return v, ok, err
	}
	expired, err := stampExpired(t.kv, key, t.now, t.ttl)
	switch {
	case errors.Is(err, errBadStamp):
		return v, true, nil
	case err != nil || expired:
		return nil, false, err
	}
	return v, true, nil
}

// Put implements [state.KV], stamping key; a reserved key is refused
// (the record's fault).
func (t *ttlKV) Put(key, value []byte) error {
	if state.IsReserved(key) {
		return errReservedTTL
	}
	if err := t.kv.Put(key, value); err != nil {
		return err
	}
	return t.kv.Put(append([]byte(ttlPrefix), key...), strconv.AppendInt(nil, t.now.UnixMilli(), 10))
}

// Delete implements [state.KV], with key's stamp; a reserved key is
// refused (the record's fault).
func (t *ttlKV) Delete(key []byte) error {
	if state.IsReserved(key) {
		return errReservedTTL
	}
	if err := t.kv.Delete(key); err != nil {
		return err
	}
	return t.kv.Delete(append([]byte(ttlPrefix), key...))
}

// Keys implements [state.KeyLister]: the keys Get finds (neither
// reserved nor expired).
func (t *ttlKV) Keys(fn func(key []byte) bool) error {
	keys, err := userKeys(t.kv)
	if err != nil {
		return err
	}
	for _, key := range keys {
		expired, err := stampExpired(t.kv, key, t.now, t.ttl)
		if err != nil && !errors.Is(err, errBadStamp) {
			return err
		}
		if !expired && !fn(key) {
			return nil
		}
	}
	return nil
}
