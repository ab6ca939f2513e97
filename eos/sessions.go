package eos

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/window"
)

// SessionCount counts the input records per key and session of spec (a
// key's records no more than spec.Gap apart, by event time): the handler
// of a processor given [Changelog], as [WindowedCount] for sessions. Each
// session's count is kept under [window.AppendSessionKey] of the record's
// key and the session (Kafka Streams' layout: key, end, start), as
// decimal text. A record within the gap of a session extends it; one
// within the gap of two merges them: the merged sessions are deleted
// (tombstones in the changelog and the updates) and the new one written,
// in the transaction. A record that would extend or merge a closed
// session (stream time past its end plus gap plus grace), or whose own
// session would be closed at once, is late: counted nowhere, counted as
// late, and with [ReturnLate] the record's fault. This is stricter than
// Kafka Streams, which merges a closed session into an open one a record
// bridges: a closed session's final may have been emitted, and is never
// changed. [EmitFinal] emits each session's final count once it closed,
// at the first sweep after: sweeps run when stream time crosses a
// multiple of an eighth of the gap (so a final comes up to that much
// stream time after the close, and a partition whose stream time stops
// before then emits it when it moves on), and read every key of the
// partition's store. A session leaves the store at the first sweep once
// stream time passed its end plus spec.Retention (at least twice the gap
// plus grace). Each key's sessions are indexed under one reserved key,
// read and written whole by each of its records: a key with many sessions
// kept (a long retention, a short gap) makes each of its records cost
// more, and an index too large for the changelog fails its records with
// [state.ErrTooLarge]. The other options, refusals and what breaks it are
// [WindowedCount]'s.
func SessionCount(spec window.Sessions, opts ...WindowOption) (HandlerFunc, error) {
	return SessionSum(spec, func(*kgo.Record) (int64, error) { return 1, nil }, opts...)
}

// SessionSum adds value(r) to r's session: as [SessionCount], which it
// generalizes. An error from value, or a sum that would overflow an
// int64, is the record's fault.
func SessionSum(spec window.Sessions, value func(*kgo.Record) (int64, error), opts ...WindowOption) (HandlerFunc, error) {
	if value == nil {
		return nil, &eoskit.ConfigError{Package: "eos", Setting: "SessionSum", Reason: "no value function"}
	}
	add := func(agg []byte, r *kgo.Record) ([]byte, error) {
		n, err := value(r)
		if err != nil {
			return nil, err
		}
		return addInt64(agg, n)
	}
	merge := func(a, b []byte) ([]byte, error) {
		n, err := state.Int64(b)
		if err != nil {
			return nil, err
		}
		return addInt64(a, n)
	}
	return sessions("SessionSum", spec, add, merge, opts)
}

// addInt64 is agg (decimal text, nil for 0) plus n, as decimal text.
func addInt64(agg []byte, n int64) ([]byte, error) {
	sum, err := state.AddInt64(agg, n)
	if err != nil {
		return nil, fmt.Errorf("eos: a session's sum: %w", err)
	}
	return state.AppendInt64(nil, sum), nil
}

// SessionAggregate sets r's session to add(agg, r), agg being the
// session's aggregate so far: that of the session r extends, the merge of
// those it joins (merge(a, b), in start order), or nil for a session r
// opens. add returning nil deletes the session. As [SessionCount]
// otherwise. An error from add or merge is the record's fault.
func SessionAggregate(spec window.Sessions, add func(agg []byte, r *kgo.Record) ([]byte, error), merge func(a, b []byte) ([]byte, error), opts ...WindowOption) (HandlerFunc, error) {
	if add == nil || merge == nil {
		return nil, &eoskit.ConfigError{Package: "eos", Setting: "SessionAggregate", Reason: "no add or merge function"}
	}
	return sessions("SessionAggregate", spec, add, merge, opts)
}

// sessionIndexPrefix is where a session aggregation keeps each key's
// sessions: sessionIndexPrefix + key holds its sessions, each
// sessionEntryLen bytes (start and end, Unix milliseconds, 8 bytes
// big-endian each, then 1 once its final was emitted), in start order.
const sessionIndexPrefix = state.ReservedPrefix + "sessions/"

const sessionEntryLen = 17

// sessionEntry is one session of a key's index.
type sessionEntry struct {
	s     window.Session
	final bool // its final was emitted
}

func readSessions(kv state.KV, key []byte) ([]sessionEntry, error) {
	v, _, err := kv.Get(append([]byte(sessionIndexPrefix), key...))
	if err != nil {
		return nil, err
	}
	if len(v)%sessionEntryLen != 0 {
		return nil, fmt.Errorf("eos: the session index of %q is %d bytes, not entries of %d", key, len(v), sessionEntryLen)
	}
	es := make([]sessionEntry, 0, len(v)/sessionEntryLen)
	for b := v; len(b) > 0; b = b[sessionEntryLen:] {
		es = append(es, sessionEntry{
			s:     window.Session{Start: time.UnixMilli(int64(binary.BigEndian.Uint64(b))), End: time.UnixMilli(int64(binary.BigEndian.Uint64(b[8:])))},
			final: b[16] == 1,
		})
	}
	return es, nil
}

func writeSessions(kv state.KV, key []byte, es []sessionEntry) error {
	idx := append([]byte(sessionIndexPrefix), key...)
	if len(es) == 0 {
		return kv.Delete(idx)
	}
	slices.SortFunc(es, func(a, b sessionEntry) int { return a.s.Start.Compare(b.s.Start) })
	v := make([]byte, 0, len(es)*sessionEntryLen)
	for _, e := range es {
		v = binary.BigEndian.AppendUint64(v, uint64(e.s.Start.UnixMilli()))
		v = binary.BigEndian.AppendUint64(v, uint64(e.s.End.UnixMilli()))
		flag := byte(0)
		if e.final {
			flag = 1
		}
		v = append(v, flag)
	}
	return kv.Put(idx, v)
}

// sessions builds a session aggregation's handler.
func sessions(setting string, spec window.Sessions, add func([]byte, *kgo.Record) ([]byte, error), merge func(a, b []byte) ([]byte, error), opts []WindowOption) (HandlerFunc, error) {
	c, err := newWindowConfig(setting, spec.Validate(), opts)
	if err != nil {
		return nil, err
	}
	every := max(spec.Gap/8, time.Millisecond).Truncate(time.Millisecond).Milliseconds()
	clock := newStreamClock()
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		hs := handlerStateOf(ctx)
		kv, at, err := c.prepareRecord(hs, setting, r)
		if err != nil {
			return nil, err
		}
		at = at.Truncate(time.Millisecond)
		was, now, err := clock.move(hs.call, kv, at)
		if err != nil {
			return nil, err
		}
		if err := sessionRecord(kv, spec, r, at, now, add, merge, hs, c.returnLate); err != nil {
			return nil, err
		}
		if !crossed(was, now, every) {
			return nil, nil
		}
		return sweepSessions(kv, spec, now, c.final)
	}, nil
}

// sessionRecord applies r, at time at, to its key's sessions at stream
// time now.
func sessionRecord(kv state.KV, spec window.Sessions, r *kgo.Record, at, now time.Time,
	add func([]byte, *kgo.Record) ([]byte, error), merge func(a, b []byte) ([]byte, error), hs handlerState, returnLate bool) error {
	es, err := readSessions(kv, r.Key)
	if err != nil {
		return err
	}
	joined := window.Session{Start: at, End: at}
	var keep, merged []sessionEntry
	late := false
	for _, e := range es {
		if !spec.Reaches(e.s, at) {
			keep = append(keep, e)
			continue
		}
		merged = append(merged, e)
		late = late || e.final || spec.Closed(e.s, now)
		joined.Start, joined.End = minTime(joined.Start, e.s.Start), maxTime(joined.End, e.s.End)
	}
	if late || spec.Closed(joined, now) {
		if hs.late != nil {
			hs.late()
		}
		if returnLate {
			return &window.LateError{Time: at, StreamTime: now, Session: &joined, Grace: spec.Grace}
		}
		return nil
	}
	var agg []byte
	for i, e := range merged { // in start order: the index is
		key := window.AppendSessionKey(nil, r.Key, e.s)
		v, ok, err := kv.Get(key)
		if err != nil {
			return err
		}
		switch {
		case !ok:
		case i == 0 || agg == nil:
			agg = v
		default:
			if agg, err = merge(agg, v); err != nil {
				return err
			}
		}
		if err := kv.Delete(key); err != nil {
			return err
		}
	}
	agg, err = add(agg, r)
	if err != nil {
		return err
	}
	if agg != nil {
		if err := kv.Put(window.AppendSessionKey(nil, r.Key, joined), agg); err != nil {
			return err
		}
		keep = append(keep, sessionEntry{s: joined})
	}
	return writeSessions(kv, r.Key, keep)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// sweepSessions reads every key's sessions at stream time now: it returns
// a final to the finals topic (if any) for each session closed whose
// final was not emitted, in key order, marks it emitted, and deletes each
// session expired (after its final).
func sweepSessions(kv state.KV, spec window.Sessions, now time.Time, final string) ([]*kgo.Record, error) {
	lister, ok := kv.(state.KeyLister)
	if !ok {
		return nil, errNoKeys
	}
	var keys [][]byte
	if err := lister.Keys(func(k []byte) bool {
		if bytes.HasPrefix(k, []byte(sessionIndexPrefix)) {
			keys = append(keys, bytes.Clone(k[len(sessionIndexPrefix):]))
		}
		return true
	}); err != nil {
		return nil, err
	}
	slices.SortFunc(keys, bytes.Compare)
	var finals []*kgo.Record
	for _, key := range keys {
		es, err := readSessions(kv, key)
		if err != nil {
			return nil, err
		}
		changed := false
		kept := es[:0]
		for _, e := range es {
			skey := window.AppendSessionKey(nil, key, e.s)
			if final != "" && !e.final && spec.Closed(e.s, now) {
				v, ok, err := kv.Get(skey)
				if err != nil {
					return nil, err
				}
				if ok {
					finals = append(finals, &kgo.Record{Topic: final, Key: skey, Value: v})
				}
				e.final, changed = true, true
			}
			if spec.Expired(e.s, now) {
				if err := kv.Delete(skey); err != nil {
					return nil, err
				}
				changed = true
				continue
			}
			kept = append(kept, e)
		}
		if changed {
			if err := writeSessions(kv, key, kept); err != nil {
				return nil, err
			}
		}
	}
	return finals, nil
}
