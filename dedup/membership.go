package dedup

import "github.com/twmb/franz-go/pkg/kgo"

// InstanceID makes the [Consumer] a static member of its group (KIP-345)
// under id, as eos.InstanceID does for a processor, whose doc says what
// it changes on a restart. Default: none, a dynamic member.
func InstanceID(id string) Option {
	return func(c *config) { c.core.ClientOpts = append(c.core.ClientOpts, kgo.InstanceID(id)) }
}
