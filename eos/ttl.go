package eos

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/window"
)

// TTL deletes each key of the keyed state that no record has written for
// d of its partition's stream time (the largest record timestamp the
// processor has handled there, kept in the store as a windowed
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
// a record without a usable timestamp (after [window.MaxTime]) is the
// record's fault. d must be whole milliseconds, at least one, at most a
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
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		hs := handlerStateOf(ctx)
		kv := hs.kv
		if !window.InRange(r.Timestamp) {
			return nil, fmt.Errorf("eos: the record's timestamp %s, by which its state expires: %w", r.Timestamp.UTC().Format(time.RFC3339Nano), window.ErrOutOfRange)
		}
		was, err := streamTime(kv)
		if err != nil {
			return nil, err
		}
		now := was
		if r.Timestamp.After(was) {
			now = r.Timestamp.Truncate(time.Millisecond)
			if err := kv.Put([]byte(streamTimeKey), strconv.AppendInt(nil, now.UnixMilli(), 10)); err != nil {
				return nil, err
			}
			// Times are past the epoch (window.InRange): a division floors.
			if was.IsZero() || was.UnixMilli()/every != now.UnixMilli()/every {
				if err := sweepTTL(kv, now, ttl); err != nil {
					return nil, err
				}
			}
		}
		ctx = withKV(ctx, &ttlKV{kv: kv, now: now, ttl: ttl}, hs)
		return h(ctx, r)
	}
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
	for key := range keys {
		if !stamped[key] {
			if err := kv.Put([]byte(ttlPrefix+key), strconv.AppendInt(nil, now.UnixMilli(), 10)); err != nil {
				return err
			}
		}
	}
	for key := range stamped {
		expired, err := stampExpired(kv, []byte(key), now, ttl)
		if err != nil {
			return err
		}
		if expired || !keys[key] {
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

// stampExpired reports whether key's stamp in kv is ttl or more before
// now (false for a key without one).
func stampExpired(kv state.KV, key []byte, now time.Time, ttl time.Duration) (bool, error) {
	v, ok, err := kv.Get(append([]byte(ttlPrefix), key...))
	if err != nil || !ok {
		return false, err
	}
	ms, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return false, fmt.Errorf("eos: the store's write time of %q, %q: %w", key, v, err)
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

func (t *ttlKV) Get(key []byte) ([]byte, bool, error) {
	v, ok, err := t.kv.Get(key)
	if err != nil || !ok || state.IsReserved(key) {
		return v, ok, err
	}
	expired, err := stampExpired(t.kv, key, t.now, t.ttl)
	if err != nil || expired {
		return nil, false, err
	}
	return v, true, nil
}

func (t *ttlKV) Put(key, value []byte) error {
	if err := t.kv.Put(key, value); err != nil || state.IsReserved(key) {
		return err
	}
	return t.kv.Put(append([]byte(ttlPrefix), key...), strconv.AppendInt(nil, t.now.UnixMilli(), 10))
}

func (t *ttlKV) Delete(key []byte) error {
	if err := t.kv.Delete(key); err != nil || state.IsReserved(key) {
		return err
	}
	return t.kv.Delete(append([]byte(ttlPrefix), key...))
}

// Keys implements [state.KeyLister]: the store's keys, those that expired
// and are not yet swept included.
func (t *ttlKV) Keys(fn func(key []byte) bool) error {
	lister, ok := t.kv.(state.KeyLister)
	if !ok {
		return errNoKeys
	}
	return lister.Keys(fn)
}
