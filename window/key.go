package window

import (
	"encoding/binary"
	"errors"
	"time"
)

// KeyLen is what [AppendKey] adds to a record's key: the window's start.
const KeyLen = 8

// AppendKey appends to dst the key of key's window starting at start:
// key's bytes, then the start in Unix milliseconds as 8 bytes big-endian,
// as Kafka Streams' TimeWindowedSerializer lays out a windowed key. The
// windowed aggregations keep each window under such a key, in their store,
// their changelog and their updates.
func AppendKey(dst, key []byte, start time.Time) []byte {
	dst = append(dst, key...)
	return binary.BigEndian.AppendUint64(dst, uint64(start.UnixMilli()))
}

// ErrShortKey is returned by [SplitKey] for a key too short to be a
// window's.
var ErrShortKey = errors.New("window: a windowed key is at least 8 bytes")

// SplitKey returns the record key and the window start of a key
// [AppendKey] made. The key returned shares b's memory.
func SplitKey(b []byte) (key []byte, start time.Time, err error) {
	if len(b) < KeyLen {
		return nil, time.Time{}, ErrShortKey
	}
	n := len(b) - KeyLen
	return b[:n:n], time.UnixMilli(int64(binary.BigEndian.Uint64(b[n:]))), nil
}
