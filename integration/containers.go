package integration

import (
	"testing"

	"github.com/eoskit/eoskit/eostest"
)

// ContainerCluster is a three-node Kafka cluster in Docker containers
// (eostest.StartKafka with WithNodes(3), on the host's network), for tests
// that stop, kill, start or replace a broker's container while its state
// stays on the node's volume. Nodes are numbered 1 to 3; the containers and their
// volumes are removed when the test ends.
type ContainerCluster struct {
	*KafkaCluster
	// Nodes stops, kills, starts and replaces the nodes' containers.
	Nodes *eostest.KafkaContainer
}

// StartContainerCluster starts a ContainerCluster. It skips tb, or fails it
// with EOS_REQUIRE_SERVICES=1, when Docker does not answer.
func StartContainerCluster(tb testing.TB) *ContainerCluster {
	tb.Helper()
	k := eostest.StartKafka(tb, eostest.WithNodes(3), eostest.WithHostNetwork(true))
	return &ContainerCluster{KafkaCluster: newKafkaCluster(tb, k.Brokers()), Nodes: k}
}
