// Package groupdesc reads what a consumer group's description says, for
// the lab's and the tests' reports of where a group stood.
package groupdesc

import (
	"slices"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Assigned returns, sorted, the partitions of topic the group's
// coordinator assigned to m (none if m's assignment is not a consumer
// protocol one).
func Assigned(m kadm.DescribedGroupMember, topic string) []int32 {
	var parts []int32
	if a, ok := m.Assigned.AsConsumer(); ok {
		for _, t := range a.Topics {
			if t.Topic == topic {
				parts = append(parts, t.Partitions...)
			}
		}
	}
	slices.Sort(parts)
	return parts
}
