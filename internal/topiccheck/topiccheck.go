// Package topiccheck tells whether the topics a runner writes to on its own
// account (a dead-letter topic, the outbox's position topic) exist, so that
// a missing one is reported as the configuration error it is when Run
// starts, rather than after every produce's metadata retries. It reads
// fresh metadata (no cached answer, no auto-creation), which needs only
// Describe on each topic (Read or Write implies it): no admin rights.
package topiccheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eoskit/eoskit"
)

const (
	// DescribeTimeout bounds one metadata look-up.
	DescribeTimeout = 30 * time.Second
	// MissingFor is how long a topic must stay missing from every
	// broker's metadata before it counts as missing: a topic just created
	// may be absent from a broker's metadata for a while (the controller
	// has it, the broker not yet; seconds on a loaded cluster).
	MissingFor = 5 * time.Second
)

// Describe returns topics' metadata from a fresh Metadata request on a
// client of its own, built from conn (the seed brokers and the
// connection's options). A topic the principal may not describe is an
// *eoskit.AuthorizationError.
func Describe(ctx context.Context, conn []kgo.Opt, topics ...string) (kadm.TopicDetails, error) {
	cl, err := kgo.NewClient(conn...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return describe(ctx, kadm.NewClient(cl), topics)
}

func describe(ctx context.Context, adm *kadm.Client, topics []string) (kadm.TopicDetails, error) {
	ctx, cancel := context.WithTimeout(ctx, DescribeTimeout)
	defer cancel()
	md, err := adm.Metadata(ctx, topics...)
	if ae, ok := errors.AsType[*kadm.AuthError](err); ok {
		return nil, &eoskit.AuthorizationError{Permission: fmt.Sprintf("Describe (or Read or Write) on topics %q", topics), Err: ae.Err}
	}
	if err != nil {
		return nil, fmt.Errorf("look up topics %q (within %s): %w", topics, DescribeTimeout, err)
	}
	return md.Topics, nil
}

// Missing returns the index in topics of one the cluster lacks (every look
// for MissingFor says so), or -1 when all exist. A topic whose look-up
// fails for another reason (a refused Describe, say) is an error naming
// it. It looks through one client of its own, built from conn.
func Missing(ctx context.Context, conn []kgo.Opt, topics ...string) (int, error) {
	cl, err := kgo.NewClient(conn...)
	if err != nil {
		return -1, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var since time.Time
	for {
		md, err := describe(ctx, adm, topics)
		if err != nil {
			return -1, err
		}
		missing := -1
		for i, topic := range topics {
			td, ok := md[topic]
			switch {
			case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
				if !knownToAnyBroker(ctx, cl, topic) {
					missing = i
				}
			case td.Err != nil:
				return -1, fmt.Errorf("look up topic %q: %w", topic, td.Err)
			}
		}
		switch {
		case missing < 0:
			return -1, nil
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= MissingFor:
			return missing, nil
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(MissingFor / 8):
		}
	}
}

// knownToAnyBroker asks every broker the client knows for topic's
// metadata: one that lists it means the topic exists, and the broker that
// answered first had not caught up yet.
func knownToAnyBroker(ctx context.Context, cl *kgo.Client, topic string) bool {
	ctx, cancel := context.WithTimeout(ctx, DescribeTimeout)
	defer cancel()
	brokers, err := kadm.NewClient(cl).ListBrokers(ctx)
	if err != nil {
		return false
	}
	for _, b := range brokers {
		req := kmsg.NewPtrMetadataRequest()
		t := kmsg.NewMetadataRequestTopic()
		t.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, t)
		resp, err := req.RequestWith(ctx, cl.Broker(int(b.NodeID)))
		if err != nil {
			continue
		}
		for _, rt := range resp.Topics {
			if rt.Topic != nil && *rt.Topic == topic && rt.ErrorCode == 0 {
				return true
			}
		}
	}
	return false
}
