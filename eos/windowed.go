package eos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/window"
)

// WindowOption configures a windowed aggregation ([WindowedCount],
// [WindowedSum], [WindowedAggregate]).
type WindowOption interface{ applyWindow(*windowConfig) }

type windowOpt func(*windowConfig)

func (o windowOpt) applyWindow(c *windowConfig) { o(c) }

type windowConfig struct {
	eventTime  func(*kgo.Record) (time.Time, error)
	returnLate bool
	final      string
	finalSet   bool // EmitFinal given (its topic may be empty: refused)
}

// EventTime sets a record's time (default: its timestamp). An error it
// returns is the record's fault (see [OnHandlerError]): return one for a
// time that cannot be right (far in the future, say), since a record's
// time moves its partition's stream time, and with it what is late.
func EventTime(fn func(*kgo.Record) (time.Time, error)) WindowOption {
	return windowOpt(func(c *windowConfig) { c.eventTime = fn })
}

// ReturnLate makes a late record (all its windows closed, or its session)
// fail in its
// handler with a *[window.LateError], the record's fault, so that the
// processor's [OnHandlerError] policy decides: [DeadLetter] sends it to
// the dead-letter topic with that reason. By default a late record
// changes nothing and the handler returns nil. Either way it is counted
// (see [LateMetrics]).
func ReturnLate() WindowOption { return windowOpt(func(c *windowConfig) { c.returnLate = true }) }

// EmitFinal produces each window's final aggregate to topic once, when
// the window closes (stream time reaches its end plus grace: Kafka
// Streams' suppress(untilWindowCloses)), keyed as the store keys it
// ([window.AppendKey]; a session's [window.AppendSessionKey]; see
// [SessionCount] for when a session's final comes), in the transaction that moves stream time there
// and commits the input offsets: never before the window closed, never
// twice (a transaction that aborts takes its finals with it; a restore
// brings back the stream time that emitted them). Nothing is emitted for
// a window whose aggregate was deleted. Give it beside, or instead of,
// [EmitUpdates]. A partition whose stream time stops moving (no records)
// closes nothing. The finals are partitioned by the producer's
// partitioner on their windowed key (not by the record key, as Kafka
// Streams does), and timestamped when produced. A topic that is the
// input, the changelog or a dead-letter topic is a *[eoskit.ConfigError]
// at the first record; an empty one from the constructor.
func EmitFinal(topic string) WindowOption {
	return windowOpt(func(c *windowConfig) { c.final, c.finalSet = topic, true })
}

// LateMetrics is implemented by an [eoskit.Metrics] that also counts the
// late records of windowed aggregations (eosprom's does). A record is
// counted each time its handler runs: one handled again (a transaction
// aborted) counts again.
type LateMetrics interface {
	LateRecord()
}

// WindowedCount counts the input records per key and per window of spec
// by event time: the handler of a processor given [Changelog] (with
// [EmitUpdates] for the stream of window counts). Each window's count is
// kept under [window.AppendKey] of the record's key and the window's start
// (Kafka Streams' layout), as decimal text, until the window expires
// (spec.Retention past its start, by stream time), when it is deleted, a
// tombstone in the changelog and the updates, in the transaction.
//
// A record's time is its timestamp, or what [EventTime] returns; each
// input partition's stream time (its largest record time) is kept in the
// partition's store, so it commits, restores and moves with the state. A
// record counts in its windows still open at the stream time it leaves
// (the window's end plus spec.Grace not reached); a record whose windows
// all closed is late (see [ReturnLate]). A record without a key, with a
// key beginning with [state.ReservedPrefix], or with a time no window
// holds (before the Unix epoch, after [window.MaxTime]) is the record's
// fault.
//
// The aggregation owns its processor's store: a handler writing keys of
// its own beside it would have them taken for windows. An invalid spec is
// a *[eoskit.ConfigError]; so is [Concurrency] under [KeyOrder], which Run
// returns at the first record (stream time follows each partition's
// order; [PartitionOrder] keeps it). See package window for the rules and docs/
// state.md for what breaks them.
func WindowedCount(spec window.Spec, opts ...WindowOption) (HandlerFunc, error) {
	return WindowedSum(spec, func(*kgo.Record) (int64, error) { return 1, nil }, opts...)
}

// WindowedSum adds value(r) to each open window of r's key: as
// [WindowedCount], which it generalizes. An error from value, or a sum that
// would overflow an int64, is the record's fault.
func WindowedSum(spec window.Spec, value func(*kgo.Record) (int64, error), opts ...WindowOption) (HandlerFunc, error) {
	if value == nil {
		return nil, &eoskit.ConfigError{Package: "eos", Setting: "WindowedSum", Reason: "no value function"}
	}
	return windowed("WindowedSum", spec, opts, value, func(kv state.KV, key []byte, _ *kgo.Record, n int64) error {
		_, err := state.Sum(kv, key, n)
		return err
	})
}

// WindowedAggregate sets each open window of r's key to add(agg, r), agg
// being the window's aggregate so far (nil for a window r opens); add
// returning nil deletes the window. As [WindowedCount] otherwise. An error
// from add is the record's fault; what add wrote to earlier windows of the
// record is then dropped with the rest of its writes.
func WindowedAggregate(spec window.Spec, add func(agg []byte, r *kgo.Record) ([]byte, error), opts ...WindowOption) (HandlerFunc, error) {
	if add == nil {
		return nil, &eoskit.ConfigError{Package: "eos", Setting: "WindowedAggregate", Reason: "no add function"}
	}
	nothing := func(*kgo.Record) (struct{}, error) { return struct{}{}, nil }
	return windowed("WindowedAggregate", spec, opts, nothing, func(kv state.KV, key []byte, r *kgo.Record, _ struct{}) error {
		agg, _, err := kv.Get(key)
		if err != nil {
			return err
		}
		next, err := add(agg, r)
		switch {
		case err != nil:
			return err
		case next == nil:
			return kv.Delete(key)
		}
		return kv.Put(key, next)
	})
}

// windowed builds a windowed aggregation's handler: prepare turns a
// record into what apply adds to each of its open windows' keys (once a
// record, however many windows it falls in).
func windowed[T any](setting string, spec window.Spec, opts []WindowOption,
	prepare func(r *kgo.Record) (T, error), apply func(kv state.KV, key []byte, r *kgo.Record, v T) error) (HandlerFunc, error) {
	c, err := newWindowConfig(setting, spec.Validate(), opts)
	if err != nil {
		return nil, err
	}
	clock := newStreamClock()
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		hs := handlerStateOf(ctx) // once: this runs for every record
		kv, at, err := c.prepareRecord(hs, setting, r)
		if err != nil {
			return nil, err
		}
		was, now, err := clock.move(hs.call, kv, at)
		if err != nil {
			return nil, err
		}
		var inline [4]window.Window // a tumbling window's, or a few hopping ones'
		open, err := spec.AppendOpen(inline[:0], at, now)
		if err != nil {
			if hs.late != nil {
				hs.late()
			}
			if c.returnLate {
				return nil, err
			}
			return nil, nil
		}
		v, err := prepare(r)
		if err != nil {
			return nil, err
		}
		lent := hs.call.borrowScratch(len(r.Key) + window.KeyLen)
		key := *lent
		for _, w := range open {
			key = window.AppendKey(key[:0], r.Key, w.Start)
			if err := apply(kv, key, r, v); err != nil {
				hs.call.giveBackScratch(lent, key)
				return nil, err
			}
			hs.call.wrote(w.Start)
		}
		hs.call.giveBackScratch(lent, key)
		closes := c.final != "" && spec.ClosesBetween(was, now)
		expires := spec.ExpiresBetween(was, now) && !hs.call.expiresNothing(spec, now)
		if !closes && !expires {
			return nil, nil
		}
		finals, earliest, err := sweep(kv, spec, was, now, c.final)
		if err != nil {
			return nil, err
		}
		hs.call.swept(earliest)
		return finals, nil
	}, nil
}

// refusedSetting returns the *eoskit.ConfigError of a windowed handler
// the processor cannot run as it is configured (which ends Run: no
// record's fault): under KeyOrder lanes, or with its finals topic one the
// processor reads or keeps for itself.
func refusedSetting(hs handlerState, setting, final, input string) error {
	switch {
	case hs.keyLanes:
		// Stream time follows the partition's order: records handled
		// side by side would each see another's.
		return &eoskit.ConfigError{Package: "eos", Setting: "Concurrency", Reason: setting +
			" handles a partition's records in order (its stream time follows them): use PartitionOrder, not KeyOrder"}
	case hs.ttl:
		return &eoskit.ConfigError{Package: "eos", Setting: "TTL", Reason: setting +
			"'s windows expire by its spec's retention: give the processor no TTL"}
	case final == "":
		return nil
	case final == input, final == hs.changelog, slices.Contains(hs.deadLetters, final):
		return &eoskit.ConfigError{Package: "eos", Setting: "EmitFinal", Reason: fmt.Sprintf(
			"the finals topic %q is the processor's input, changelog or dead-letter topic", final)}
	}
	return nil
}

// errNoKeys is returned when a windowed aggregation's state cannot list
// its keys (a KV other than the processor's).
var errNoKeys = errors.New("eos: a windowed aggregation's state cannot list its keys")

// sweep runs when stream time, moving from was to now, passes a close or
// an expiry point (see window.Spec.ClosesBetween and ExpiresBetween): in
// one read of every key of the store, it returns a record to the finals
// topic (if any) for each window that closes, with its aggregate as the
// transaction sees it, in window-key order, and deletes each window that
// expired (after its final: a window may close and expire at once). It
// also returns the earliest start of the windows it leaves (the zero
// time for none; see windowbound.go).
func sweep(kv state.KV, spec window.Spec, was, now time.Time, final string) ([]*kgo.Record, time.Time, error) {
	var closed, expired [][]byte
	var earliest time.Time
	err := forWindows(kv, spec, func(key []byte, w window.Window) {
		if final != "" && spec.Closed(w, now) && !spec.Closed(w, was) {
			closed = append(closed, key)
		}
		switch {
		case spec.Expired(w, now):
			expired = append(expired, key)
		case earliest.IsZero() || w.Start.Before(earliest):
			earliest = w.Start
		}
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	slices.SortFunc(closed, bytes.Compare)
	finals := make([]*kgo.Record, 0, len(closed))
	for _, key := range closed {
		v, ok, err := kv.Get(key)
		if err != nil {
			return nil, time.Time{}, err
		}
		if ok {
			finals = append(finals, &kgo.Record{Topic: final, Key: key, Value: v})
		}
	}
	for _, key := range expired {
		if err := kv.Delete(key); err != nil {
			return nil, time.Time{}, err
		}
	}
	return finals, earliest, nil
}

// newWindowConfig is a windowed or session aggregation's options, or the
// *eoskit.ConfigError of its invalid spec (invalid: Validate's error) or
// options.
func newWindowConfig(setting string, invalid error, opts []WindowOption) (windowConfig, error) {
	if invalid != nil {
		return windowConfig{}, &eoskit.ConfigError{Package: "eos", Setting: setting, Reason: invalid.Error(), Err: invalid}
	}
	c := windowConfig{eventTime: func(r *kgo.Record) (time.Time, error) { return r.Timestamp, nil }}
	for _, o := range opts {
		o.applyWindow(&c)
	}
	if c.finalSet && c.final == "" {
		return windowConfig{}, &eoskit.ConfigError{Package: "eos", Setting: "EmitFinal", Reason: "the finals topic is empty"}
	}
	return c, nil
}

// prepareRecord is what a windowed or session aggregation does first with
// r: it refuses a setting the processor cannot run it under, and returns
// the store r is aggregated in and r's event time, or r's fault (no key,
// a reserved one, an extractor's error, a time no window holds: checked
// before it moves stream time).
func (c windowConfig) prepareRecord(hs handlerState, setting string, r *kgo.Record) (state.KV, time.Time, error) {
	if err := refusedSetting(hs, setting, c.final, r.Topic); err != nil {
		return nil, time.Time{}, err
	}
	kv, err := aggregatingOn(hs.kv, r)
	if err != nil {
		return nil, time.Time{}, err
	}
	at, err := c.eventTime(r)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("eos: the record's event time: %w", err)
	}
	if !window.InRange(at) {
		return nil, time.Time{}, fmt.Errorf("eos: the record's time %s: %w", at.UTC().Format(time.RFC3339Nano), window.ErrOutOfRange)
	}
	return kv, at, nil
}

// userKeys returns the keys kv holds but the reserved ones, after reading
// every key of the store (the caller may then read kv).
func userKeys(kv state.KV) ([][]byte, error) {
	lister, ok := kv.(state.KeyLister)
	if !ok {
		return nil, errNoKeys
	}
	var keys [][]byte
	err := lister.Keys(func(key []byte) bool {
		if !state.IsReserved(key) {
			keys = append(keys, key)
		}
		return true
	})
	return keys, err
}

// forWindows calls fn with each window key of kv and its window of spec,
// after reading every key of the store (fn may read kv).
func forWindows(kv state.KV, spec window.Spec, fn func(key []byte, w window.Window)) error {
	keys, err := userKeys(kv)
	if err != nil {
		return err
	}
	for _, key := range keys {
		_, start, err := window.SplitKey(key)
		if err != nil {
			continue // too short to be a window's: not the aggregation's
		}
		fn(key, spec.Starting(start))
	}
	return nil
}
