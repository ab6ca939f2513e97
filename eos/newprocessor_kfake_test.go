package eos_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eoskit/eoskit/eos"
)

// groupRequests counts the JoinGroup requests a client writes.
type groupRequests struct{ joins atomic.Int64 }

func (g *groupRequests) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	if k := kmsg.Key(key); k == kmsg.JoinGroup || k == kmsg.ConsumerGroupHeartbeat {
		g.joins.Add(1)
	}
}

var _ kgo.HookBrokerWrite = (*groupRequests)(nil)

// NewProcessor checks the client options by building a client, which it
// closes at once. That client must not join the processor's group: a
// join, even a brief one, rebalances the group's running members and
// calls the caller's partition callbacks (given in ClientOptions) as if
// the processor had been assigned partitions. It was built with the
// group and its topics, so it started joining, and a caller's
// OnPartitionsAssigned counted the partitions twice when the join won
// the race with Close (eosprom's TestOneMetricsServesEveryPath, once in
// two dozen runs).
func TestNewProcessorDoesNotJoinTheGroup(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	var seen groupRequests
	var assigned atomic.Int64
	txnID, _ := eos.StableTransactionalID("newprocessor", "0")
	for range 20 {
		_, err := eos.NewProcessor(copyHandler("out"), eos.Brokers(cluster.ListenAddrs()...), eos.Group("newprocessor"), eos.Topics("in"),
			eos.TransactionalID(txnID), eos.ClientOptions(kgo.WithHooks(&seen),
				kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
					assigned.Add(int64(len(parts["in"])))
				})))
		if err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	if n := seen.joins.Load(); n > 0 || assigned.Load() > 0 {
		t.Fatalf("20 NewProcessor calls sent %d JoinGroup requests and called the caller's OnPartitionsAssigned for %d partitions; want none: only Run joins the group", n, assigned.Load())
	}
}
