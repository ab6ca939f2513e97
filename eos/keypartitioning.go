package eos

import (
	"context"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

// RequireKeyPartitioning makes Run refuse input that is not partitioned
// by its record keys as p partitions them: a record with a key that p
// would put in another partition of its topic ends Run with a
// *[eoskit.ConfigError] naming the record. The aggregations ([Count],
// [Sum], [Reduce], the windowed ones) keep each input partition's state
// apart, so a key whose records are spread over partitions is counted in
// parts, each partition emitting its own partial result under the key:
// this check refuses that instead. Give the partitioner the input's
// producers use: kgo.StickyKeyPartitioner(nil) for franz-go's and the
// Java client's default (murmur2 of the key); a librdkafka client
// (confluent-kafka-go) hashes keys with CRC32 by default. Records without
// a key are not checked. Needs [Changelog]. [NewGrouped]'s aggregating
// processor checks its repartition topic so. Default: no check (the
// producers are trusted to partition by key).
func RequireKeyPartitioning(p kgo.Partitioner) ProcessorOption {
	return processorOpt(func(c *config) { c.keyPartitioner = p })
}

// withKeyPartitioning returns h behind RequireKeyPartitioning's check of
// each record against p, over partitions() partitions.
func withKeyPartitioning(h HandlerFunc, p kgo.Partitioner, partitions func() int32) HandlerFunc {
	var mu sync.Mutex // a TopicPartitioner is not safe for concurrent use
	byTopic := map[string]kgo.TopicPartitioner{}
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if r.Key == nil {
			return h(ctx, r)
		}
		n := int(partitions())
		mu.Lock()
		tp, ok := byTopic[r.Topic]
		if !ok {
			tp = p.ForTopic(r.Topic)
			byTopic[r.Topic] = tp
		}
		keyed := tp.RequiresConsistency(r)
		want := partitionOf(tp, r, n)
		mu.Unlock()
		if !keyed {
			return nil, &eoskit.ConfigError{Package: "eos", Setting: "RequireKeyPartitioning",
				Reason: "the partitioner given does not place records by their keys: give the one the input's producers partition by key with"}
		}
		if want != int(r.Partition) {
			return nil, &eoskit.ConfigError{Package: "eos", Setting: "RequireKeyPartitioning", Reason: fmt.Sprintf(
				"the record at %s[%d]@%d has a key the input's partitioner puts in partition %d of %d: the input is not partitioned by its keys (another writer, another partitioner, or partitions added), and its aggregation by key would be split",
				r.Topic, r.Partition, r.Offset, want, n)}
		}
		return h(ctx, r)
	}
}

// partitionOf is the partition of n that tp puts r in, as the producer
// asks it (franz-go's default partitioner answers only PartitionByBackup;
// a keyed record's partition does not depend on the backup).
func partitionOf(tp kgo.TopicPartitioner, r *kgo.Record, n int) int {
	if bp, ok := tp.(kgo.TopicBackupPartitioner); ok {
		return bp.PartitionByBackup(r, n, &noBackup{n: n})
	}
	return tp.Partition(r, n)
}

// noBackup is a kgo.TopicBackupIter of n partitions with nothing
// buffered.
type noBackup struct{ i, n int }

func (b *noBackup) Next() (int, int64) {
	b.i++
	return b.i - 1, 0
}

func (b *noBackup) Rem() int { return b.n - b.i }
