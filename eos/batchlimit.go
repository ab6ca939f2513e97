package eos

import "sync"

// minBatchBytes is the least batch limit franz-go takes for a topic
// (kgo.ProducerBatchMaxBytesFn: a value outside [512, 1<<30] fails the
// topic's produces).
const minBatchBytes = 512

// batchLimits is the producer's batch limit per topic
// (kgo.ProducerBatchMaxBytesFn) for a stateful processor: the caller's
// (franz-go's default, 1,000,012 bytes, when none), capped for the
// changelog and the updates topic at their max.message.bytes once Run
// has read them. The broker refuses a batch above the topic's limit
// whole, and a transaction's state records for a partition go in as few
// batches as the producer's limit allows: under a changelog's limit
// below the producer's, writes each small enough alone (see
// state.ErrTooLarge) would fail together at the commit, and the session
// would restart on them until Run gave up. franz-go asks once per
// partition, when the partition is first produced to: Run learns the
// limits before its first session's client does.
type batchLimits struct {
	caller func(topic string) int32
	mu     sync.Mutex
	topics map[string]int32 // the state's topics' max.message.bytes
}

func newBatchLimits(caller func(string) int32) *batchLimits {
	return &batchLimits{caller: caller, topics: map[string]int32{}}
}

// learn notes topic's max.message.bytes.
func (b *batchLimits) learn(topic string, maxMessageBytes int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.topics[topic] = int32(min(maxMessageBytes, 1<<30))
}

// limit is the batch limit for topic: what kgo.ProducerBatchMaxBytesFn
// returns.
func (b *batchLimits) limit(topic string) int32 {
	n := b.caller(topic)
	b.mu.Lock()
	t, ok := b.topics[topic]
	b.mu.Unlock()
	if ok && t < n {
		n = max(t, minBatchBytes)
	}
	return n
}
