package dedup

import "github.com/eoskit/eoskit/internal/consume"

// InstanceID makes the [Consumer] a static member of its group (KIP-345)
// under id, as eos.InstanceID does for a processor, whose doc says what
// it changes on a restart. Default: none, a dynamic member.
func InstanceID(id string) Option { return shared(consume.InstanceID(id)) }

// ConsumerProtocol joins the group with Kafka's consumer group protocol
// (KIP-848, group.protocol=consumer), as eos.ConsumerProtocol does for a
// processor, whose doc says what changes and what Run checks first (Kafka
// 4.3 or later on every broker, group.version finalized, a range or sticky
// balancer): a cluster that falls short is an *eoskit.ConfigError naming
// ConsumerProtocol from Run. Default: the classic protocol.
func ConsumerProtocol() Option { return shared(consume.ConsumerProtocol()) }
