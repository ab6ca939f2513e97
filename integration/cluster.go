package integration

import (
	"testing"
)

// Cluster is a three-node Kafka cluster in Docker containers, for tests
// of what an application does while a broker stops, crashes, hangs or is
// replaced. Every topic, internal ones included, has replication factor 3
// and min.insync.replicas 2 (and the offsets and transaction-state topics
// Kafka's default 50 partitions), so a single node down leaves every
// partition writable, as on a production cluster. Nodes are numbered 1 to
// 3; each keeps its data on a volume of its own. The containers and their
// volumes are removed when the test ends.
type Cluster struct {
	*KafkaCluster
	// Nodes stops, kills, pauses, starts and replaces the nodes.
	Nodes *KafkaContainer
}

// StartCluster starts a [Cluster] on the host's network
// ([WithNodes](3), [WithHostNetwork](true); opts may add an image or
// labels) and returns it once every node is a broker and every replica is
// in sync. It skips tb, or fails it with EOS_REQUIRE_SERVICES=1, when
// Docker does not answer. It always starts containers: a cluster named by
// KAFKA_BROKERS can not have its nodes stopped.
func StartCluster(tb testing.TB, opts ...KafkaOption) *Cluster {
	tb.Helper()
	k := StartKafka(tb, append([]KafkaOption{WithNodes(3), WithHostNetwork(true)}, opts...)...)
	return &Cluster{KafkaCluster: KafkaAt(tb, k.Brokers()), Nodes: k}
}
