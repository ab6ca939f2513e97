package integration

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// topicTimeout bounds creating a topic and waiting for it, and deleting it.
const topicTimeout = 30 * time.Second

// NewTopic creates a topic with a unique name ([UniqueName]) and the given
// number of partitions, as [KafkaCluster.CreateTopic] does, and returns its
// name.
func (k *KafkaCluster) NewTopic(partitions int32) string {
	k.tb.Helper()
	topic := UniqueName(k.tb, "t")
	k.CreateTopic(topic, partitions, nil)
	return topic
}

// CreateTopic creates topic with the given partitions and configs (nil
// for the cluster's defaults: replication factor 1 on one broker, 3 on a
// three-node cluster), returns once every broker's metadata lists each of
// its partitions with a leader (so that a producer or a consumer started
// next finds it wherever it asks), and deletes it when the test ends. It
// fails the test when that takes more than 30 s.
func (k *KafkaCluster) CreateTopic(topic string, partitions int32, configs map[string]*string) {
	k.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), topicTimeout)
	defer cancel()
	resp, err := k.Admin.CreateTopic(ctx, partitions, -1, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		k.tb.Fatalf("integration: create topic %s: %v", topic, err)
	}
	k.tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), topicTimeout)
		defer cancel()
		_, _ = k.Admin.DeleteTopics(ctx, topic)
	})
	if err := k.waitForTopic(ctx, topic, partitions); err != nil {
		k.tb.Fatalf("integration: topic %s created, but not ready within %v: %v", topic, topicTimeout, err)
	}
}

// waitForTopic returns once every broker answers Metadata listing each of
// topic's partitions with a leader, or with what was missing when ctx ends.
func (k *KafkaCluster) waitForTopic(ctx context.Context, topic string, partitions int32) error {
	cl, err := kgo.NewClient(k.conn...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		err := everyBrokerLists(ctx, cl, topic, partitions)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func everyBrokerLists(ctx context.Context, cl *kgo.Client, topic string, partitions int32) error {
	md, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, b := range md.Brokers {
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl.Broker(int(b.NodeID)))
		if err != nil {
			return fmt.Errorf("broker %d: %w", b.NodeID, err)
		}
		if len(resp.Topics) != 1 {
			return fmt.Errorf("broker %d lists %d topics, want 1", b.NodeID, len(resp.Topics))
		}
		t := resp.Topics[0]
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return fmt.Errorf("broker %d: %w", b.NodeID, err)
		}
		if int32(len(t.Partitions)) != partitions {
			return fmt.Errorf("broker %d lists %d of %d partitions", b.NodeID, len(t.Partitions), partitions)
		}
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("broker %d: partition %d: %w", b.NodeID, p.Partition, err)
			}
			if p.Leader < 0 {
				return fmt.Errorf("broker %d: partition %d has no leader", b.NodeID, p.Partition)
			}
		}
	}
	return nil
}

// Produce writes recs synchronously with an idempotent producer, to topic
// for each record that names none, and fails the test if any is not
// acknowledged within 30 s.
func (k *KafkaCluster) Produce(topic string, recs ...*kgo.Record) {
	k.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append(slices.Clip(k.conn), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))...)
	if err != nil {
		k.tb.Fatalf("integration: new kafka client: %v", err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		k.tb.Fatalf("integration: produce to %s: %v", topic, err)
	}
}
