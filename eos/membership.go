package eos

import "github.com/twmb/franz-go/pkg/kgo"

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
