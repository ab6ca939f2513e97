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
//
// The leader also places the standbys (planStandbys), for the assignment
// it plans, and writes each member's into its assignment's user data,
// which every member reads back from the group's description
// (owners.describe): an owner's partitions keep their standbys on
// different members, so that when it leaves each lands where the balance
// has room for it.
type standbyBalancer struct {
	warm     *atomic.Pointer[[]int32] // what this member holds warm now
	standbys int                      // Standbys' n
}

const standbyProtocol = "eoskit-standby-v2"

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
	var standbys map[string][]int32
	for _, t := range slices.Sorted(maps.Keys(topics)) {
		members := interested[t]
		if len(members) == 0 {
			continue
		}
		owners := map[int32]string{}
		for p, c := range owned[t] {
			owners[p] = c.member
		}
		target := planWarm(topics[t], members, owners, warm)
		for member, parts := range target {
			plan.AddPartitions(byID[member], t, parts)
		}
		if standbys == nil { // a stateful processor consumes one topic
			standbys = planStandbys(members, target, warm, b.standbys)
		}
	}
	// The standbys of the target: a partition moving waits a round for
	// its new owner, its standbys placed already.
	plan.AdjustCooperative(cb)
	return &standbyPlan{plan, standbys}
}

// standbyPlan is a BalancePlan whose members' assignments carry their
// standbys in their user data (encodePlanned).
type standbyPlan struct {
	*kgo.BalancePlan
	standbys map[string][]int32 // by member id
}

func (sp *standbyPlan) IntoSyncAssignment() []kmsg.SyncGroupRequestGroupAssignment {
	out := sp.BalancePlan.IntoSyncAssignment()
	for i := range out {
		var a kmsg.ConsumerMemberAssignment
		if err := a.ReadFrom(out[i].MemberAssignment); err != nil {
			continue // franz-go's own encoding: cannot fail
		}
		a.UserData = encodePlanned(sp.standbys[out[i].MemberID])
		out[i].MemberAssignment = a.AppendTo(nil)
	}
	return out
}

// planStandbys places n standbys of each partition of target (member: the
// partitions it is to own) on members other than its owner: for each
// owner in turn, each of its partitions on the members holding the
// fewest of that owner's partitions so far (so that an owner's
// partitions spread their standbys, and go to different members when it
// leaves), then on one that holds it warm (warm: a standby kept, or a
// store parked, moves no data), then on the one keeping the fewest
// standbys, then in members' order. Taken in order, so that every leader
// computes the same plan.
func planStandbys(members []string, target, warm map[string][]int32, n int) map[string][]int32 {
	members = slices.Compact(slices.Sorted(slices.Values(members)))
	out := make(map[string][]int32, len(members))
	load := map[string]int{}
	for _, owner := range members {
		spread := map[string]int{}
		for _, p := range slices.Sorted(slices.Values(target[owner])) {
			var chosen []string
			for range n {
				best := ""
				for _, m := range members {
					if m == owner || slices.Contains(chosen, m) {
						continue
					}
					if best == "" || betterStandby(m, best, p, spread, warm, load) {
						best = m
					}
				}
				if best == "" {
					break // fewer members than standbys asked for
				}
				chosen = append(chosen, best)
				spread[best]++
				load[best]++
				out[best] = append(out[best], p)
			}
		}
	}
	for m := range out {
		slices.Sort(out[m])
	}
	return out
}

// betterStandby reports whether m is a better standby of p than best
// (see planStandbys); a tie keeps best, earlier in members' order.
func betterStandby(m, best string, p int32, spread map[string]int, warm map[string][]int32, load map[string]int) bool {
	if spread[m] != spread[best] {
		return spread[m] < spread[best]
	}
	if wm, wb := slices.Contains(warm[m], p), slices.Contains(warm[best], p); wm != wb {
		return wm
	}
	return load[m] < load[best]
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

// plannedVersion is the first byte of an assignment's user data: the
// encoding of the standbys the leader placed.
const plannedVersion = 1

// encodePlanned is the assignment's user data listing the member's
// standbys: plannedVersion, then each partition as a uvarint.
func encodePlanned(standbys []int32) []byte {
	out := []byte{plannedVersion}
	for _, p := range standbys {
		out = binary.AppendUvarint(out, uint64(p))
	}
	return out
}

// decodePlanned reads encodePlanned's user data, and reports whether it
// is one (an assignment of another balancer has none).
func decodePlanned(b []byte) ([]int32, bool) {
	if len(b) == 0 || b[0] != plannedVersion {
		return nil, false
	}
	ps, ok := uvarints(b[1:])
	return ps, ok
}

// uvarints reads partitions encoded as uvarints, and reports whether
// every byte made one.
func uvarints(b []byte) ([]int32, bool) {
	var ps []int32
	for len(b) > 0 {
		v, k := binary.Uvarint(b)
		if k <= 0 || v > 1<<31-1 {
			return nil, false
		}
		ps = append(ps, int32(v))
		b = b[k:]
	}
	return ps, true
}

// decodeWarm reads encodeWarm's user data; anything else (another
// version, bytes cut short) lists nothing: the member is then balanced
// as one that holds nothing warm.
func decodeWarm(b []byte) []int32 {
	if len(b) == 0 || b[0] != warmVersion {
		return nil
	}
	warm, _ := uvarints(b[1:])
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
