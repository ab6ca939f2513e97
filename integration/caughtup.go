package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// WaitCaughtUp returns once group has committed, for every partition of
// topic, an offset past the last record a read_committed consumer sees
// there: once the group's consumers have processed the whole input. Call
// it after the input is written; it fails the test, naming the partitions
// behind and by how much, when that takes longer than timeout.
//
// It reads the offsets Kafka holds for the group: those an eos.Processor
// commits in its transactions, or a dedup consumer after its database
// commit. An offsetstore.Runner keeps its offsets in PostgreSQL and
// copies them to the group only with offsetstore.MirrorToKafka.
//
// The end is the last visible record's offset plus one, not the high
// watermark: a consumer commits the offset after the last record it
// processed, and a partition whose input ends in a transaction's commit
// or abort marker, or in an aborted transaction, has its high watermark
// beyond that.
func (k *KafkaCluster) WaitCaughtUp(group, topic string, timeout time.Duration) {
	k.tb.Helper()
	deadline := time.Now().Add(timeout)
	ends := map[int32]int64{}
	for _, r := range k.ReadAll(topic, kgo.ReadCommitted(), timeout) {
		ends[r.Partition] = max(ends[r.Partition], r.Offset+1)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	for {
		behind, err := k.behind(ctx, group, topic, ends)
		if err == nil && len(behind) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			if err != nil {
				k.tb.Fatalf("integration: group %s not caught up on %s within %v: %v", group, topic, timeout, err)
			}
			k.tb.Fatalf("integration: group %s not caught up on %s within %v: %s", group, topic, timeout, strings.Join(behind, ", "))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// behind lists the partitions of topic whose committed offset in group is
// short of its end, as "topic[p] at committed of end".
func (k *KafkaCluster) behind(ctx context.Context, group, topic string, ends map[int32]int64) ([]string, error) {
	fetched, err := k.Admin.FetchOffsets(ctx, group)
	if err == nil {
		err = fetched.Error()
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for p, end := range ends {
		at := int64(-1) // none committed
		if o, ok := fetched.Lookup(topic, p); ok {
			at = o.At
		}
		if at < end {
			out = append(out, fmt.Sprintf("%s[%d] at %d of %d", topic, p, at, end))
		}
	}
	slices.Sort(out)
	return out, nil
}
