package outbox

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/loop"
)

// pending is a batch being published: whole database transactions, and
// the ids of records that go to the dead-letter topic instead.
type pending struct {
	txns []*dbTxn
	dead map[int64]error
	// isolate: publish the first database transaction alone, probed
	// first (see Relay.probe).
	isolate bool
	// oneByOne: produce each record alone and wait for it, so that a
	// refusal names the record at fault.
	oneByOne bool
}

// rowKey carries a record's outbox identity in its Context, for the
// partitioner and for blame.
type rowKey struct{}

type rowInfo struct {
	id        int64
	topic     string
	partition int32
}

func pinnedTo(p int32) context.Context {
	return context.WithValue(context.Background(), rowKey{}, rowInfo{id: -1, partition: p})
}

// record returns what to produce for rw: the record, or its dead letter.
func (c *config) record(rw row, dead map[int64]error) *kgo.Record {
	info := rowInfo{id: rw.id, topic: rw.rec.Topic, partition: rw.partition}
	cause, isDead := dead[rw.id]
	if !isDead {
		rec := *rw.rec
		rec.Context = context.WithValue(context.Background(), rowKey{}, info)
		return &rec
	}
	// The record's own dead-letter headers go: its writer chose them.
	hs := []kgo.RecordHeader{{Key: loop.HeaderOutboxID, Value: []byte(strconv.FormatInt(rw.id, 10))}}
	if !errors.Is(cause, ErrPositionRecord) {
		// A record addressed as a position names no topic to replay it
		// to: whoever replays it must choose one (-to-topic).
		hs = append(hs, kgo.RecordHeader{Key: loop.HeaderOutboxTopic, Value: []byte(rw.rec.Topic)})
	}
	hs = append(hs, kgo.RecordHeader{Key: loop.HeaderOutboxError, Value: []byte(cause.Error())})
	hs = append(hs, loop.WithoutDeadLetterHeaders(rw.rec.Headers)...)
	value := rw.rec.Value
	if errors.Is(cause, kerr.MessageTooLarge) || errors.Is(cause, kerr.RecordListTooLarge) {
		value = nil // kept, value included, in the dead-letter table
		hs = append(hs, kgo.RecordHeader{Key: loop.HeaderOutboxValue, Value: []byte("omitted (too large); the record is kept in " + c.deadLetters())})
	}
	return &kgo.Record{Topic: c.deadLetter, Key: rw.rec.Key, Value: value, Headers: hs, Timestamp: rw.rec.Timestamp,
		Context: context.WithValue(context.Background(), rowKey{}, rowInfo{id: rw.id, topic: c.deadLetter, partition: -1})}
}

// partitioner sends a record pinned with WriteToPartition (or the position
// record) to its partition, a keyed record where Kafka's default
// partitioner would (murmur2 of the key), and spreads the others.
func partitioner() kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(topic string) func(*kgo.Record, int) int {
		keyed := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
		var mu sync.Mutex
		next := 0
		return func(r *kgo.Record, n int) int {
			if r.Context != nil {
				if info, ok := r.Context.Value(rowKey{}).(rowInfo); ok && info.partition >= 0 {
					return int(info.partition) // out of range fails the record
				}
			}
			if r.Key != nil {
				return keyed.Partition(r, n)
			}
			mu.Lock()
			defer mu.Unlock()
			next = (next + 1) % n
			return next
		}
	})
}
