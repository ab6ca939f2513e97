package state

import (
	"bytes"
	"slices"
)

// Scanner is a [Reader] that reads a range of its keys in key order
// itself, without reading the rest (pebblestore's Store is one).
type Scanner interface {
	// Scan calls fn for each key from start (inclusive; nil: the first)
	// to end (exclusive; nil: past the last) and its value, in key
	// order, until fn returns false, over one consistent view of the
	// store. The slices are valid during the call only.
	Scan(start, end []byte, fn func(key, value []byte) bool) error
}

// Scan calls fn for each of r's keys from start (inclusive; nil: the
// first) to end (exclusive; nil: past the last) and its value, in key
// order, until fn returns false. A [Scanner] scans the range itself; any
// other reader (the memory store) is read whole and the keys in range
// sorted, so that its cost grows with the store rather than the range,
// and fn runs after that read (an Apply does not wait for fn). The slices
// are valid during the call only.
func Scan(r Reader, start, end []byte, fn func(key, value []byte) bool) error {
	if s, ok := r.(Scanner); ok {
		return s.Scan(start, end, fn)
	}
	type kv struct{ k, v []byte }
	var in []kv
	err := r.Range(func(k, v []byte) bool {
		if InRange(k, start, end) {
			in = append(in, kv{bytes.Clone(k), bytes.Clone(v)})
		}
		return true
	})
	if err != nil {
		return err
	}
	slices.SortFunc(in, func(a, b kv) int { return bytes.Compare(a.k, b.k) })
	for _, e := range in {
		if !fn(e.k, e.v) {
			break
		}
	}
	return nil
}

// InRange reports whether key lies from start (inclusive; nil: no lower
// bound) to end (exclusive; nil: no upper bound).
func InRange(key, start, end []byte) bool {
	return bytes.Compare(key, start) >= 0 && (end == nil || bytes.Compare(key, end) < 0)
}

// PrefixEnd returns the first key after every key beginning with prefix:
// the end, exclusive, of their range (nil, no end, when prefix is empty
// or all 0xff bytes).
func PrefixEnd(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
