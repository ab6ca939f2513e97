package eos

import (
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/loop"
)

// InstanceID makes a [Processor] a static member of its group (KIP-345,
// kgo.InstanceID) under id: stable per instance, unique among the
// instances running at once, like the instance in [StableTransactionalID]
// (use the same name). Default: none, a dynamic member.
//
// A dynamic member that restarts joins as a new member: the group first
// waits out the session timeout of the one it replaces (kgo.SessionTimeout,
// 45 s by default), and every member's partitions move. A static member
// that restarts within its session timeout takes its partitions back with
// no rebalance. The price: a static member that closes sends no
// LeaveGroup, so its partitions wait out the session timeout when it is
// stopped for good, or scaled down. Until the group assigns it, its Health
// is not Ready. The id must not be empty (the client refuses it when Run
// starts).
func InstanceID(id string) ProcessorOption {
	return processorOpt(func(c *config) { c.clientOpts = append(c.clientOpts, kgo.InstanceID(id)) })
}

// ConsumerProtocol joins the group with Kafka's consumer group protocol
// (KIP-848, group.protocol=consumer; franz-go's kgo.ServerSideBalancer):
// the group coordinator assigns the partitions, a member's heartbeat
// carries its changes, and no rebalance stops the group. Default: the
// classic protocol.
//
// What changes: revokes are incremental, as under the cooperative-sticky
// balancer (a partition the member keeps is never fetched again; one taken
// away ends the transaction under way, which aborts and goes to its next
// owner); there is no JoinGroup, so the broker's group.consumer.* settings
// (session timeout 45 s, heartbeat 5 s by default) apply, not
// kgo.SessionTimeout; the group is described with ConsumerGroupDescribe
// (kadm.DescribeConsumerGroups), not DescribeGroups.
//
// Run checks, before it joins, that every broker serves it well: Kafka 4.3
// or later (KIP-1251: before, an offset commit racing a heartbeat's epoch
// bump fails, and a transaction aborts whenever the group changes), with
// group.version finalized, under a range or sticky balancer (franz-go's
// default, cooperative-sticky, is one). Otherwise Run returns an
// *eoskit.ConfigError naming ConsumerProtocol and saying which broker
// falls short, rather than franz-go's silent fallback to the classic
// protocol.
func ConsumerProtocol() ProcessorOption {
	return processorOpt(func(c *config) {
		c.consumerProtocol = true
		c.clientOpts = append(c.clientOpts, loop.ConsumerProtocolOpts()...)
	})
}
