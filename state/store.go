package state

import (
	"errors"
	"fmt"
)

// Write is one change to a key: its new value, or nil to delete it. A
// changelog record carries it as is (a nil value is a tombstone); an empty,
// non-nil value is a value.
type Write struct {
	Key   []byte
	Value []byte
}

// TopicID is a Kafka topic's ID (a UUID). The zero TopicID names no
// topic.
type TopicID [16]byte

// Checkpoint is how far a store holds its changelog partition: every
// committed record before Offset has been applied, none after. It also
// names the changelog topic by ID, so that a store kept from a topic since
// deleted and created again under the same name is never taken for a
// store of the new one.
type Checkpoint struct {
	// TopicID is the changelog topic's ID; zero for a store that holds
	// nothing yet.
	TopicID TopicID
	// Offset is the next changelog offset to read (0 for an empty
	// store): one past the last record applied, which may be the offset
	// of a transaction marker.
	Offset int64
}

// CheckApply refuses an Apply that would move a store at c to next when
// it must not: backwards ([ErrCheckpointBehind]), or to another topic ID
// without a Reset first. Every [Store] implementation calls it in Apply.
func (c Checkpoint) CheckApply(next Checkpoint) error {
	switch {
	case next.Offset < c.Offset:
		return fmt.Errorf("%w: apply up to offset %d, store at %d", ErrCheckpointBehind, next.Offset, c.Offset)
	case c.TopicID != (TopicID{}) && next.TopicID != c.TopicID:
		return fmt.Errorf("state: apply for topic ID %x to a store of topic ID %x: reset it first", next.TopicID, c.TopicID)
	}
	return nil
}

// Reader is the read side of a [Store]: the committed state of one
// partition. Every method is safe to call from any goroutine (an HTTP
// handler, say) while the store is written: a reader sees each Apply
// whole or not at all, never what a transaction under way wrote.
type Reader interface {
	// Get returns key's value and true, or nil and false when key has
	// none. The slice returned is the caller's; key is only read, during
	// the call (callers share one key across partitions).
	Get(key []byte) (value []byte, ok bool, err error)
	// Range calls fn for each key and its value until fn returns false,
	// over one consistent view of the store; in no particular order (the
	// pebble store goes in key order). The slices passed to fn are valid
	// during the call only. An Apply may wait for a Range of the memory
	// store to end: keep fn short.
	Range(fn func(key, value []byte) bool) error
	// Checkpoint returns how far the store holds its changelog.
	Checkpoint() Checkpoint
}

// Store holds the committed state of one changelog partition (one input
// partition's keys) and the checkpoint that says how far into the
// changelog it goes. Each Apply and Reset is atomic, its writes and its
// checkpoint together: after a crash a store is as some Apply left it,
// and its checkpoint says which. [NewMemory] and pebblestore.Open make
// the stores eoskit provides; another implementation must keep the same
// promises.
//
// A store holds only what committed in Kafka: a runner applies a
// transaction's writes after the transaction committed, never before, so a
// store may lag its changelog (the restore reads the tail) but is never
// ahead of it.
type Store interface {
	Reader
	// Apply applies writes in order (a nil Value deletes its key) and
	// moves the checkpoint to cp, atomically. A cp.Offset behind the
	// current one is refused with [ErrCheckpointBehind]. The writes'
	// keys and values are only read, during the call: a [Txn] hands over
	// the slices it holds, which its readers may be reading.
	Apply(writes []Write, cp Checkpoint) error
	// Reset drops every key and sets the checkpoint to cp, atomically:
	// what a restore does before reading a changelog from its start
	// (the topic was created again, or the store's checkpoint lies past
	// the changelog's end).
	Reset(cp Checkpoint) error
	// Close releases the store; any later call fails with [ErrClosed].
	Close() error
}

// Factory opens the store of one partition of a changelog topic. A runner
// calls it when the partition is assigned, or (eos.Standbys) when it keeps
// the partition warm for another instance, from more than one goroutine,
// and closes the store when it no longer needs it: at most one store of a
// partition is open at a time on one runner.
type Factory func(topic string, partition int32) (Store, error)

// MemoryFactory is a [Factory] of [NewMemory] stores: each assignment
// starts empty and is restored from the changelog's start.
func MemoryFactory() Factory {
	return func(string, int32) (Store, error) { return NewMemory(), nil }
}

var (
	// ErrClosed is returned by a Store used after Close.
	ErrClosed = errors.New("state: store closed")

	// ErrCheckpointBehind is returned by Apply for a checkpoint behind
	// the store's: the store would claim to hold less than it does.
	ErrCheckpointBehind = errors.New("state: checkpoint behind the store's")

	// ErrTooLarge is wrapped by the error [Txn]'s Put and Delete return
	// for a key and value that would make a changelog record larger than
	// the changelog accepts (its max.message.bytes): the fault of the
	// record being handled, not of the runner.
	ErrTooLarge = errors.New("state: key and value too large for the changelog")

	// ErrNotInt64 is wrapped by the error [Count] and [Sum] return when
	// the key holds a value that is not a count (see [Int64]), and by
	// Int64 itself.
	ErrNotInt64 = errors.New("state: value is not a decimal int64")

	// ErrOverflow is wrapped by the error [Sum] returns when the sum
	// would overflow an int64.
	ErrOverflow = errors.New("state: int64 overflow")
)

// RestoreError is what a restore that could not finish returns: the
// changelog partition it read, how far it got, and why (the deadline, a
// leader out of reach, a store that failed). The partition's store holds
// the changelog up to Reached, which a later restore goes on from.
// errors.Is and errors.As see Err.
type RestoreError struct {
	Topic     string
	Partition int32
	// From is where the restore started, Reached how far it applied,
	// Target the changelog's high watermark it read towards (-1 when it
	// never learned it); a Reached below it with no error of the broker's
	// means a transaction open on the changelog did not end in time.
	From, Reached, Target int64
	Err                   error
}

func (e *RestoreError) Error() string {
	target := "unknown"
	if e.Target >= 0 {
		target = fmt.Sprint(e.Target)
	}
	return fmt.Sprintf("state: restore of changelog %s[%d] stopped at offset %d (from %d, towards %s): %v",
		e.Topic, e.Partition, e.Reached, e.From, target, e.Err)
}

func (e *RestoreError) Unwrap() error { return e.Err }
