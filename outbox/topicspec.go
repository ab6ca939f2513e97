package outbox

import "github.com/eoskit/eoskit/topics"

// PositionTopicSpec is the shape an exactly-once relay's position topic
// must have, for [topics.Ensure]: one partition (the relay's positions are
// read back in order) and cleanup.policy=compact (only the last position
// under each key matters, and a deleting retention would lose it). Its
// replication factor is the broker's default.replication.factor, which is
// 1 unless the cluster sets it: in production set ReplicationFactor to 3
// and min.insync.replicas to 2 on the returned Spec, as for any topic an
// exactly-once pipeline writes.
func PositionTopicSpec(topic string) topics.Spec {
	return topics.Spec{Name: topic, Partitions: 1, Configs: map[string]string{"cleanup.policy": "compact"}}
}
