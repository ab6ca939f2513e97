package testbed

import (
	"context"
	"strconv"
	"testing"

	"github.com/eoskit/eoskit/integration"
)

// LocalCluster is a three-node KRaft cluster of the test's own
// (scripts/kafka-cluster.sh): replication factor 3 and min.insync.replicas
// 2 for every topic, internal ones included, for tests that bounce brokers.
// A bounce then moves partition leadership instead of leaving partitions
// leaderless, as a single broker must (where Kafka 4.1-4.4 drops
// transaction markers, KAFKA-20734). Nodes are numbered 1 to 3. It is
// stopped and its data deleted when the test ends.
type LocalCluster struct {
	*integration.KafkaCluster
	script   string
	stateDir string
}

// StartLocalClusterWithACLs starts a private three-node cluster that, like
// [StartLocalBrokerWithACLs], authenticates every client (SASL/SCRAM, on
// the brokers' listeners and the proxies' alike) and authorizes every
// request; its KafkaCluster acts as the super user.
func StartLocalClusterWithACLs(tb testing.TB) *LocalCluster {
	tb.Helper()
	c := newLocalCluster(tb)
	c.KafkaCluster = startPrivateWith(tb, c.script, c.stateDir, saslACLs)
	return c
}

// StartLocalCluster starts a private three-node cluster and returns it once
// every node is a live broker. It skips or fails like [StartLocalBroker].
// Starting one takes 10 to 20 seconds and three broker JVMs.
func StartLocalCluster(tb testing.TB) *LocalCluster {
	tb.Helper()
	c := newLocalCluster(tb)
	c.KafkaCluster = startPrivate(tb, c.script, c.stateDir)
	return c
}

// newLocalCluster prepares a private cluster's state folder and its
// cleanup.
func newLocalCluster(tb testing.TB) *LocalCluster {
	tb.Helper()
	c := &LocalCluster{script: privateKafkaScript(tb, "private Kafka cluster", "scripts/kafka-cluster.sh"), stateDir: tb.TempDir()}
	tb.Cleanup(func() {
		if _, err := runScript(context.Background(), c.script, c.stateDir, "clean"); err != nil {
			tb.Logf("testbed: clean private cluster: %v", err)
		}
	})
	return c
}

func (c *LocalCluster) do(ctx context.Context, args ...string) error {
	_, err := runScript(ctx, c.script, c.stateDir, args...)
	return err
}

// Kill kills node (1 to 3) with SIGKILL and waits until it is gone.
func (c *LocalCluster) Kill(ctx context.Context, node int) error {
	return c.do(ctx, "kill", strconv.Itoa(node))
}

// StartNode starts node again on its data and returns once every replica
// is in sync.
func (c *LocalCluster) StartNode(ctx context.Context, node int) error {
	return c.do(ctx, "start-node", strconv.Itoa(node))
}

// Pause stops node with SIGSTOP (a hung broker); Resume sends SIGCONT.
func (c *LocalCluster) Pause(ctx context.Context, node int) error {
	return c.do(ctx, "pause", strconv.Itoa(node))
}

// Resume continues a paused node.
func (c *LocalCluster) Resume(ctx context.Context, node int) error {
	return c.do(ctx, "resume", strconv.Itoa(node))
}

// Restart stops node (SIGKILL when hard), starts it, and returns once every
// replica is in sync.
func (c *LocalCluster) Restart(ctx context.Context, node int, hard bool) error {
	if hard {
		return c.do(ctx, "restart", strconv.Itoa(node), "--hard")
	}
	return c.do(ctx, "restart", strconv.Itoa(node))
}

// RollingRestart restarts the nodes one by one, each once the cluster is
// whole again.
func (c *LocalCluster) RollingRestart(ctx context.Context, hard bool) error {
	if hard {
		return c.do(ctx, "rolling-restart", "--hard")
	}
	return c.do(ctx, "rolling-restart")
}
