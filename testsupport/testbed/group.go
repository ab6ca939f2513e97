package testbed

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/testsupport/groupdesc"
)

// GroupSettled reports whether group's coordinator holds it Stable with
// one member per view given (a runner's Health), the members' assignments
// covering every one of topic's partitions and so do the views (each
// runner took its assignment in); otherwise it says what it saw. A runner's own view of its
// partitions is not enough to tell that a rebalance has ended: after a
// member leaves, the others still hold their partitions of the generation
// before while the coordinator waits for them to rejoin, and a member that
// joins meanwhile joins that rebalance, taking the leaver's partitions,
// free, and revoking nothing. In a cooperative group's first round the
// partitions being moved are assigned to no one, so full coverage also
// tells that the second round is over. It reads a classic group (the
// protocol franz-go uses unless kgo.ServerSideBalancer opts into KIP-848).
func GroupSettled(ctx context.Context, adm *kadm.Client, group, topic string, partitions int, views ...eoskit.Health) (bool, string, error) {
	groups, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return false, "", err
	}
	g, ok := groups[group]
	if !ok {
		return false, "", fmt.Errorf("describe group %s: not in the response", group)
	}
	if g.Err != nil {
		return false, "", fmt.Errorf("describe group %s: %w", group, g.Err)
	}
	covered := map[int32]bool{}
	desc := fmt.Sprintf("group %s %s, generation of %d members:", group, g.State, len(g.Members))
	for _, m := range g.Members {
		parts := groupdesc.Assigned(m, topic)
		for _, p := range parts {
			covered[p] = true
		}
		desc += fmt.Sprintf(" %s %v", m.MemberID, parts)
	}
	seen := map[int32]bool{}
	for _, v := range views {
		for _, p := range v.Assigned[topic] {
			seen[p] = true
		}
	}
	desc += fmt.Sprintf("; the %d runners' own views cover %d of %d partitions", len(views), len(seen), partitions)
	return g.State == "Stable" && len(g.Members) == len(views) && len(covered) == partitions && len(seen) == partitions, desc, nil
}
