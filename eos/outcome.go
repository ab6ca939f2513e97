package eos

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A commit that End reported as not made may still have landed: franz-go
// retries a failed EndTxn (UNKNOWN_SERVER_ERROR, a lost connection) as an
// abort and returns (false, nil), which looks like a rebalance's abort.
// Going on in the same session would rewind to franz-go's view of the
// committed offsets and copy a committed batch again. The group's offsets,
// read from the broker, tell whether it was aborted.

// stableOffset is one partition's answer to a stable offset fetch: the
// committed offset (-1: none), or the error (UNSTABLE_OFFSET_COMMIT while
// a transaction's offset commit is pending).
type stableOffset struct {
	at  int64
	err error
}

// abortedBefore decides, from the group's stable offsets, whether a batch
// that consumed each partition of ends up to its end offset was aborted:
// every partition must be answered, without error, with an offset before
// its end. A partition missing from the answer, pending (markers on their
// way) or committed at its end leaves the outcome unknown.
func abortedBefore(ends map[topicPartition]int64, fetched map[topicPartition]stableOffset) bool {
	for tp, end := range ends {
		o, ok := fetched[tp]
		if !ok || o.err != nil || o.at >= end {
			return false
		}
	}
	return true
}

// knownAbort reports whether the batch b, whose commit End reported as not
// made, was indeed aborted (a group error, a failed heartbeat, a rebalance
// that took nothing from this member), so that the session may go on as
// after a rebalance. When the offsets show it committed, pending, or
// cannot be read, the outcome is unknown.
func (p *Processor) knownAbort(ctx context.Context, cl *kgo.Client, b *batch) bool {
	if len(b.ends) == 0 {
		return true // nothing consumed: nothing to commit
	}
	fetchCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	fetched, err := fetchStableOffsets(fetchCtx, cl, p.cfg.group, b.ends)
	if err != nil {
		p.logger.Debug("eos: reading the group's offsets after an unconfirmed commit failed", "err", err)
		return false
	}
	return abortedBefore(b.ends, fetched)
}

// fetchStableOffsets asks the group's coordinator for the offsets of the
// partitions of ends, stable only (RequireStable). The fetch names the
// partitions: asked for all of a group's offsets, Kafka lists only
// partitions with a committed offset, so a pending first commit would be
// missing rather than reported unstable.
func fetchStableOffsets(ctx context.Context, cl *kgo.Client, group string, ends map[topicPartition]int64) (map[topicPartition]stableOffset, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group, req.RequireStable = group, true
	index := map[string]int{}
	for tp := range ends {
		i, ok := index[tp.topic]
		if !ok {
			i = len(req.Topics)
			index[tp.topic] = i
			t := kmsg.NewOffsetFetchRequestTopic()
			t.Topic = tp.topic
			req.Topics = append(req.Topics, t)
		}
		req.Topics[i].Partitions = append(req.Topics[i].Partitions, tp.partition)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	fetched := map[topicPartition]stableOffset{}
	add := func(topic string, partition int32, at int64, code int16) {
		fetched[topicPartition{topic, partition}] = stableOffset{at, kerr.ErrorForCode(code)}
	}
	if len(resp.Groups) > 0 { // v8+
		g := resp.Groups[0]
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			return nil, err
		}
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				add(t.Topic, p.Partition, p.Offset, p.ErrorCode)
			}
		}
		return fetched, nil
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, err
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			add(t.Topic, p.Partition, p.Offset, p.ErrorCode)
		}
	}
	if len(fetched) == 0 {
		return nil, errors.New("the offset fetch answered no partition")
	}
	return fetched, nil
}
