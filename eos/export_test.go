package eos

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// KnownAbort lets the external tests ask knownAbort about a batch that
// consumed topic's partition up to end.
func (p *Processor) KnownAbort(ctx context.Context, cl *kgo.Client, topic string, partition int32, end int64) bool {
	return p.knownAbort(ctx, cl, &batch{ends: map[topicPartition]int64{{topic, partition}: end}})
}
