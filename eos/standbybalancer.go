package eos

import (
	"encoding/binary"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// standbyBalancer is the group balancer of a processor with [Standbys]
// under the classic protocol, when the caller left franz-go's default
// (cooperative-sticky): cooperative and sticky as that one, it also puts
// each partition whose owner left on a member that holds it warm (a
// standby's store, or the store of a partition taken away it still
// keeps), wherever the balance allows. Each member lists what it holds
// warm in its join's user data. The processor offers cooperative-sticky
// after it, so that a group whose members do not all know this protocol
// (a rolling upgrade from an earlier eoskit) agrees on that one.
type standbyBalancer struct {
	warm *atomic.Pointer[[]int32] // what this member holds warm now
}

const standbyProtocol = "eoskit-standby-v1"

// warmVersion is the first byte of the user data: the encoding's.
const warmVersion = 1

func (*standbyBalancer) ProtocolName() string { return standbyProtocol }
func (*standbyBalancer) IsCooperative() bool  { return true }

func (b *standbyBalancer) JoinGroupMetadata(topics []string, current map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = topics
	meta.Generation = generation
	for _, t := range slices.Sorted(maps.Keys(current)) {
		owned := kmsg.NewConsumerMemberMetadataOwnedPartition()
		owned.Topic, owned.Partitions = t, current[t]
		meta.OwnedPartitions = append(meta.OwnedPartitions, owned)
	}
	var warm []int32
	if w := b.warm.Load(); w != nil {
		warm = *w
	}
	meta.UserData = encodeWarm(warm)
	return meta.AppendTo(nil)
}

func (*standbyBalancer) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	return kgo.ParseConsumerSyncAssignment(assignment)
}

func (b *standbyBalancer) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	cb, err := kgo.NewConsumerBalancer(b, members)
	return cb, cb.MemberTopics(), err
}

// Balance plans each topic with planWarm (the warm lists apply to every
// topic the members consume: a stateful processor consumes one), then
// withholds, for this round, the partitions that move from a member that
// owns them (cooperative: it revokes them and rejoins first).
func (b *standbyBalancer) Balance(cb *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	byID := map[string]*kmsg.JoinGroupResponseMember{}
	interested := map[string][]string{} // topic: its members
	owned := map[string]map[int32]claim{}
	warm := map[string][]int32{}
	cb.EachMember(func(m *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		byID[m.MemberID] = m
		for _, t := range meta.Topics {
			interested[t] = append(interested[t], m.MemberID)
		}
		for _, o := range meta.OwnedPartitions {
			if owned[o.Topic] == nil {
				owned[o.Topic] = map[int32]claim{}
			}
			for _, p := range o.Partitions {
				// Two claims (a member rejoining with a stale view):
				// the higher generation's stands.
				if c, ok := owned[o.Topic][p]; !ok || meta.Generation > c.generation {
					owned[o.Topic][p] = claim{m.MemberID, meta.Generation}
				}
			}
		}
		warm[m.MemberID] = decodeWarm(meta.UserData)
	})
	plan := cb.NewPlan()
	for _, t := range slices.Sorted(maps.Keys(topics)) {
		members := interested[t]
		if len(members) == 0 {
			continue
		}
		owners := map[int32]string{}
		for p, c := range owned[t] {
			owners[p] = c.member
		}
		for member, parts := range planWarm(topics[t], members, owners, warm) {
			plan.AddPartitions(byID[member], t, parts)
		}
	}
	plan.AdjustCooperative(cb)
	return plan
}

// claim is a member's claim to own a partition, with the generation it
// claims it in.
type claim struct {
	member     string
	generation int32
}

// planWarm assigns partitions 0 to n-1 among members, as even as can be
// (counts differing by one at most): each member keeps what owners says
// it owns, up to its share; then every other partition goes to the member
// with the fewest that holds it warm (warm), if one still has room, else
// to the member with the fewest. Members and partitions are taken in
// order, so that every leader computes the same plan.
func planWarm(n int32, members []string, owners map[int32]string, warm map[string][]int32) map[string][]int32 {
	members = slices.Sorted(slices.Values(members))
	members = slices.Compact(members)
	plan := make(map[string][]int32, len(members))
	if len(members) == 0 || n <= 0 {
		return plan
	}
	base, extra := int(n)/len(members), int(n)%len(members)
	// room says whether member may take one more: below the base share,
	// or at it while shares of one more are left.
	room := func(member string) bool {
		k := len(plan[member])
		return k < base || (k == base && extra > 0)
	}
	take := func(member string, p int32) {
		if len(plan[member]) == base {
			extra--
		}
		plan[member] = append(plan[member], p)
	}
	ownedBy := map[string][]int32{}
	for p := range n {
		if o, ok := owners[p]; ok && slices.Contains(members, o) {
			ownedBy[o] = append(ownedBy[o], p)
		}
	}
	// Members owning the most keep theirs first, so that the shares of
	// one more go to those who already hold that many.
	keepers := slices.Clone(members)
	slices.SortStableFunc(keepers, func(a, b string) int { return len(ownedBy[b]) - len(ownedBy[a]) })
	assigned := map[int32]bool{}
	for _, m := range keepers {
		for _, p := range ownedBy[m] {
			if !room(m) {
				break
			}
			take(m, p)
			assigned[p] = true
		}
	}
	fewest := func(ok func(string) bool) string {
		best := ""
		for _, m := range members {
			if room(m) && ok(m) && (best == "" || len(plan[m]) < len(plan[best])) {
				best = m
			}
		}
		return best
	}
	// The partitions left, those with the fewest warm holders first (a
	// partition warm on one member only gets it before another warm on
	// that member and elsewhere too fills it), those warm nowhere last
	// (they must not fill a warm holder's room).
	var left []int32
	holders := map[int32]int{}
	for p := range n {
		if !assigned[p] {
			left = append(left, p)
			for _, m := range members {
				if slices.Contains(warm[m], p) {
					holders[p]++
				}
			}
		}
	}
	rank := func(p int32) int {
		if holders[p] == 0 {
			return len(members) + 1
		}
		return holders[p]
	}
	slices.SortStableFunc(left, func(a, b int32) int { return rank(a) - rank(b) })
	for _, p := range left {
		m := fewest(func(m string) bool { return slices.Contains(warm[m], p) })
		if m == "" {
			m = fewest(func(string) bool { return true })
		}
		take(m, p)
	}
	return plan
}

// encodeWarm is the user data listing warm partitions: warmVersion, then
// each partition as a uvarint.
func encodeWarm(warm []int32) []byte {
	out := []byte{warmVersion}
	for _, p := range warm {
		out = binary.AppendUvarint(out, uint64(p))
	}
	return out
}

// decodeWarm reads encodeWarm's user data; anything else (another
// version, bytes cut short) lists nothing: the member is then balanced
// as one that holds nothing warm.
func decodeWarm(b []byte) []int32 {
	if len(b) == 0 || b[0] != warmVersion {
		return nil
	}
	var warm []int32
	for b = b[1:]; len(b) > 0; {
		v, k := binary.Uvarint(b)
		if k <= 0 || v > 1<<31-1 {
			return nil
		}
		warm = append(warm, int32(v))
		b = b[k:]
	}
	return warm
}

// defaultBalancer reports whether cl balances its group with franz-go's
// default, cooperative-sticky alone, with no rack-aware balancing
// (kgo.BalanceRacks, which standbyBalancer does not do) nor the consumer
// protocol asked for through the client's options (kgo.ServerSideBalancer,
// which needs a sticky or range balancer first): a processor with
// standbys may then replace it with standbyBalancer. An explicit
// kgo.Balancers(kgo.CooperativeStickyBalancer()) cannot be told from the
// default, and is replaced too.
func defaultBalancer(cl *kgo.Client) bool {
	bs, _ := cl.OptValue(kgo.Balancers).([]kgo.GroupBalancer)
	racks, _ := cl.OptValue(kgo.BalanceRacks).(bool)
	serverSide, _ := cl.OptValue(kgo.ServerSideBalancer).(bool)
	return len(bs) == 1 && bs[0].ProtocolName() == "cooperative-sticky" && bs[0].IsCooperative() && !racks && !serverSide
}
