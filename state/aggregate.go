package state

import (
	"fmt"
	"math"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Counts and sums are stored as decimal text: an optional minus sign and
// the digits of an int64, nothing else ("42", "-7"), as
// strconv.FormatInt writes them. A dashboard, kafka-console-consumer or a
// SQL sink reads them as they are, and any language parses them; the
// cost is up to 20 bytes a value instead of 8.

// Int64 decodes a count or a sum as [Count] and [Sum] store it. A value
// that is not one is an error wrapping [ErrNotInt64].
func Int64(value []byte) (int64, error) {
	if n, ok := shortInt64(value); ok {
		return n, nil
	}
	// Long, or not decimal text: strconv decides (shortInt64 is the fast
	// path, 12 ns against strconv's 33 on the 2-core machine).
	n, err := strconv.ParseInt(string(value), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w (%d bytes)", ErrNotInt64, len(value))
	}
	return n, nil
}

// shortInt64 decodes a count or a sum of at most 18 digits (no int64
// overflows there), as strconv.ParseInt would, without allocating: ok is
// false for anything else, which Int64 leaves to strconv.
func shortInt64(v []byte) (int64, bool) {
	neg := len(v) > 0 && v[0] == '-'
	digits := v
	if neg || len(v) > 0 && v[0] == '+' {
		digits = v[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// AppendInt64 appends n encoded as [Count] and [Sum] store it.
func AppendInt64(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

// Count adds one to key's count and returns the new count (1 for a key
// that had none).
func Count(kv KV, key []byte) (int64, error) { return Sum(kv, key, 1) }

// Sum adds n to key's sum and returns the new sum (n for a key that had
// none). A sum that would overflow an int64 is an error wrapping
// [ErrOverflow], and changes nothing.
func Sum(kv KV, key []byte, n int64) (int64, error) {
	// A handler's Scope (StateOf's) is read and written without copying
	// the value: the sum is parsed from it, and a new one handed over.
	if scope, ok := kv.(*Scope); ok {
		return scope.add(key, n)
	}
	old, _, err := kv.Get(key)
	if err != nil {
		return 0, err
	}
	sum, err := AddInt64(old, n)
	if err != nil {
		return 0, sumError(key, err)
	}
	return sum, kv.Put(key, AppendInt64(nil, sum))
}

// sumError is the error of a sum at key that AddInt64 refused.
func sumError(key []byte, err error) error {
	return fmt.Errorf("state: sum of a key of %d bytes: %w", len(key), err)
}

// AddInt64 returns sum (a sum as decimal text, nil for none: 0) plus n.
// A sum that is not decimal text is an error, and one that would
// overflow an int64 an error wrapping [ErrOverflow].
func AddInt64(sum []byte, n int64) (int64, error) {
	var s int64
	if sum != nil {
		v, err := Int64(sum)
		if err != nil {
			return 0, err
		}
		s = v
	}
	if n > 0 && s > math.MaxInt64-n || n < 0 && s < math.MinInt64-n {
		return 0, fmt.Errorf("%d + %d: %w", s, n, ErrOverflow)
	}
	return s + n, nil
}

// Reduce sets key's value to fn(old, value), old being key's current
// value (nil for a key that has none; the first value of a key is
// fn(nil, value)), and returns it. fn returning nil deletes the key. fn
// may keep neither slice.
func Reduce(kv KV, key, value []byte, fn func(old, value []byte) []byte) ([]byte, error) {
	old, _, err := kv.Get(key)
	if err != nil {
		return nil, err
	}
	v := fn(old, value)
	if v == nil {
		return nil, kv.Delete(key)
	}
	return v, kv.Put(key, v)
}

// Updates turns a transaction's [Txn.Dirty] into the records an
// aggregation emits to topic: one per changed key, with its final value
// (nil, a tombstone, for a deleted key), in key order, however many
// inputs changed the key in the transaction, as Kafka Streams' record
// cache does between commits. Produced in the same transaction, readers
// of topic see one update per key per transaction. Reserved keys
// ([ReservedPrefix]) are left out.
func Updates(dirty []Write, topic string) []*kgo.Record {
	out := make([]*kgo.Record, 0, len(dirty))
	for _, w := range dirty {
		if !IsReserved(w.Key) {
			out = append(out, &kgo.Record{Topic: topic, Key: w.Key, Value: w.Value})
		}
	}
	return out
}
