package eos

import (
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A member left (a, which owned 0 and 3): its partitions go to the
// members that hold them warm, 3 to b and 0 to c; without the warm lists
// the same balance puts them the other way round (the control).
func TestPlanWarmPutsALeaversPartitionsOnTheirWarmStoresUnit(t *testing.T) {
	owners := map[int32]string{1: "b", 4: "b", 2: "c", 5: "c"}
	got := planWarm(6, []string{"c", "b"}, owners, map[string][]int32{"b": {3}, "c": {0}})
	if want := []int32{1, 4, 3}; !slices.Equal(got["b"], want) {
		t.Errorf("b: %v, want %v", got["b"], want)
	}
	if want := []int32{2, 5, 0}; !slices.Equal(got["c"], want) {
		t.Errorf("c: %v, want %v", got["c"], want)
	}
	// 4 is warm on both, 5 on a alone: 5 goes first, so both land warm.
	got = planWarm(6, []string{"a", "b"}, map[int32]string{0: "a", 1: "a", 2: "b", 3: "b"}, map[string][]int32{"a": {4, 5}, "b": {4}})
	if !slices.Contains(got["a"], 5) || !slices.Contains(got["b"], 4) {
		t.Errorf("two warm on a, one of them on b too: %v, want 5 on a and 4 on b", got)
	}
	// 5 is warm nowhere: it must not take a's room before 4, warm on a alone.
	got = planWarm(6, []string{"a", "b"}, map[int32]string{0: "a", 1: "a", 2: "b", 3: "b"}, map[string][]int32{"a": {4}})
	if !slices.Contains(got["a"], 4) {
		t.Errorf("4 warm on a alone, 5 nowhere: %v, want 4 on a", got)
	}
	blind := planWarm(6, []string{"b", "c"}, owners, nil)
	if !slices.Contains(blind["b"], 0) || !slices.Contains(blind["c"], 3) {
		t.Errorf("without warm lists: %v, want 0 on b and 3 on c (the control differs from the warm plan)", blind)
	}
}

// Whatever the members, owners and warm lists: every partition assigned
// once, shares differing by one at most, each member keeping its owned
// partitions up to its share, a partition with no owner on a warm member
// whenever one had room, and the plan independent of the members' order.
func TestPlanWarmIsBalancedStickyAndWarmUnit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := int32(rng.IntN(20))
		var members []string
		for i := range 1 + rng.IntN(5) {
			members = append(members, string(rune('a'+i)))
		}
		owners := map[int32]string{}
		warm := map[string][]int32{}
		for p := range n {
			if rng.IntN(3) > 0 {
				owners[p] = string(rune('a' + rng.IntN(6))) // f: a member gone
			}
			if rng.IntN(2) == 0 {
				m := members[rng.IntN(len(members))]
				warm[m] = append(warm[m], p)
			}
		}
		plan := planWarm(n, members, owners, warm)
		shuffled := slices.Clone(members)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		again := planWarm(n, shuffled, owners, warm)
		seen := map[int32]string{}
		lo, hi := int(n), 0
		for _, m := range members {
			if !slices.Equal(plan[m], again[m]) {
				t.Fatalf("plan depends on the members' order: %v and %v", plan, again)
			}
			lo, hi = min(lo, len(plan[m])), max(hi, len(plan[m]))
			for _, p := range plan[m] {
				if other, ok := seen[p]; ok {
					t.Fatalf("partition %d on %s and %s: %v", p, other, m, plan)
				}
				seen[p] = m
			}
			kept, owned := 0, 0
			for p, o := range owners {
				if o == m {
					owned++
					if seen[p] == m || slices.Contains(plan[m], p) {
						kept++
					}
				}
			}
			if share := int(n) / len(members); kept < min(owned, share) {
				t.Fatalf("%s kept %d of its %d owned partitions, share %d: %v (owners %v)", m, kept, owned, share, plan, owners)
			}
		}
		if len(seen) != int(n) {
			t.Fatalf("%d of %d partitions assigned: %v", len(seen), n, plan)
		}
		if n > 0 && hi-lo > 1 {
			t.Fatalf("shares %d to %d: %v", lo, hi, plan)
		}
	}
}

// What a member holds warm survives the trip through its join's user
// data; user data of another kind lists nothing.
func TestWarmUserDataUnit(t *testing.T) {
	for _, warm := range [][]int32{nil, {0}, {3, 1, 2_000_000}} {
		if got := decodeWarm(encodeWarm(warm)); !slices.Equal(got, warm) {
			t.Errorf("decodeWarm(encodeWarm(%v)) = %v", warm, got)
		}
	}
	for _, junk := range [][]byte{nil, {9, 1}, {warmVersion, 0x80}, {warmVersion, 0xff, 0xff, 0xff, 0xff, 0x7f}} {
		if got := decodeWarm(junk); got != nil {
			t.Errorf("decodeWarm(%x) = %v, want nothing", junk, got)
		}
	}
}

// The balancer end to end, as franz-go's leader runs it: the members'
// joins (owned partitions and warm lists) in, the assignments out. A
// leaver's partitions go to their warm stores; a member that joins takes
// its share from the others, who keep the rest, and the partitions that
// move are withheld this round (cooperative: their owner revokes them
// first).
func TestStandbyBalancerUnit(t *testing.T) {
	join := func(id string, owned []int32, warm []int32, gen int32) kmsg.JoinGroupResponseMember {
		w := &atomic.Pointer[[]int32]{}
		w.Store(&warm)
		b := &standbyBalancer{warm: w}
		current := map[string][]int32{}
		if owned != nil {
			current["in"] = owned
		}
		m := kmsg.NewJoinGroupResponseMember()
		m.MemberID, m.ProtocolMetadata = id, b.JoinGroupMetadata([]string{"in"}, current, gen)
		return m
	}
	balance := func(members ...kmsg.JoinGroupResponseMember) map[string][]int32 {
		t.Helper()
		b := &standbyBalancer{warm: &atomic.Pointer[[]int32]{}}
		mb, topics, err := b.MemberBalancer(members)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := topics["in"]; !ok {
			t.Fatalf("topics %v", topics)
		}
		into, err := mb.(kgo.GroupMemberBalancerOrError).BalanceOrError(map[string]int32{"in": 6})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]int32{}
		for _, a := range into.IntoSyncAssignment() {
			parts, err := b.ParseSyncAssignment(a.MemberAssignment)
			if err != nil {
				t.Fatal(err)
			}
			out[a.MemberID] = slices.Sorted(slices.Values(parts["in"]))
		}
		return out
	}
	got := balance(join("b", []int32{1, 4}, []int32{3}, 5), join("c", []int32{2, 5}, []int32{0}, 5))
	if !slices.Equal(got["b"], []int32{1, 3, 4}) || !slices.Equal(got["c"], []int32{0, 2, 5}) {
		t.Errorf("after a leave: %v, want 3 with b and 0 with c (their warm stores)", got)
	}
	got = balance(join("a", nil, []int32{5}, -1), join("b", []int32{0, 1, 2}, nil, 5), join("c", []int32{3, 4, 5}, nil, 5))
	if len(got["a"]) != 0 || !slices.Equal(got["b"], []int32{0, 1}) || !slices.Equal(got["c"], []int32{3, 4}) {
		t.Errorf("a joins: %v, want b and c to keep two each, 2 and 5 withheld while they revoke", got)
	}
	got = balance(join("a", nil, []int32{5}, -1), join("b", []int32{0, 1}, nil, 6), join("c", []int32{3, 4}, nil, 6))
	if !slices.Equal(got["a"], []int32{2, 5}) {
		t.Errorf("the next round: %v, want 2 and 5 for a", got)
	}
}

// A processor with standbys under the classic protocol and no balancer
// of the caller's balances with standbyBalancer, cooperative-sticky
// after it; given a balancer, or under KIP-848, it keeps what it has.
func TestStandbysBalanceTheGroupUnlessABalancerIsGivenUnit(t *testing.T) {
	base := []ProcessorOption{Brokers("127.0.0.1:1"), Group("g"), Topics("in"), TransactionalID("t"), Endpoint("http://a.invalid")}
	for _, c := range []struct {
		name  string
		opts  []ProcessorOption
		first string
	}{
		{"standbys", []ProcessorOption{Changelog("cl", Standbys(1))}, standbyProtocol},
		{"no standbys", []ProcessorOption{Changelog("cl")}, "cooperative-sticky"},
		{"range given", []ProcessorOption{Changelog("cl", Standbys(1)), ClientOptions(kgo.Balancers(kgo.RangeBalancer()))}, "range"},
		{"KIP-848", []ProcessorOption{Changelog("cl", Standbys(1)), ConsumerProtocol()}, "cooperative-sticky"},
		{"racks", []ProcessorOption{Changelog("cl", Standbys(1)), ClientOptions(kgo.Rack("r1"), kgo.BalanceRacks())}, "cooperative-sticky"},
		{"server side", []ProcessorOption{Changelog("cl", Standbys(1)), ClientOptions(kgo.ServerSideBalancer())}, "cooperative-sticky"},
	} {
		p, err := NewProcessor(Count(), append(slices.Clone(base), c.opts...)...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		cl, err := newClient(p.cfg, RoleConsumer)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		bs, _ := cl.OptValue(kgo.Balancers).([]kgo.GroupBalancer)
		cl.Close()
		if len(bs) == 0 || bs[0].ProtocolName() != c.first {
			t.Errorf("%s: balancers %v, want %s first", c.name, bs, c.first)
		}
		if c.first == standbyProtocol && (len(bs) != 2 || bs[1].ProtocolName() != "cooperative-sticky") {
			t.Errorf("%s: balancers %v, want cooperative-sticky offered after", c.name, bs)
		}
	}
}

// The leader's standby placement: an owner's partitions of one parity
// (a holds 0 and 2 of six among three members) keep their standbys on
// two different members, where the ring (standbyPartitions: partition p's
// 1+p%2 members after its owner) puts both on b, which has room for one
// of them when a leaves (the control). A member warm on a partition keeps
// its standby when the spread allows; with two standbys, each partition's
// are the two other members; with more asked than there are other
// members, as many as there are.
func TestPlanStandbysUnit(t *testing.T) {
	members := []string{"a", "b", "c"}
	target := map[string][]int32{"a": {0, 2}, "b": {1, 3}, "c": {4, 5}}
	got := planStandbys(members, target, nil, 1)
	keeper := map[int32]string{}
	for m, ps := range got {
		for _, p := range ps {
			if prev, ok := keeper[p]; ok {
				t.Fatalf("partition %d has standbys on %s and %s, want one", p, prev, m)
			}
			keeper[p] = m
		}
	}
	for owner, ps := range target {
		for _, p := range ps {
			if keeper[p] == "" || keeper[p] == owner {
				t.Errorf("partition %d (owner %s): standby on %q", p, owner, keeper[p])
			}
		}
		if keeper[ps[0]] == keeper[ps[1]] {
			t.Errorf("%s's partitions %v: both standbys on %s", owner, ps, keeper[ps[0]])
		}
	}
	ringOwners := map[int32]string{}
	for m, ps := range target {
		for _, p := range ps {
			ringOwners[p] = m
		}
	}
	if ring := standbyPartitions(ringOwners, members, "b", 1); !slices.Contains(ring, 0) || !slices.Contains(ring, 2) {
		t.Errorf("the ring gives b %v, want both of a's 0 and 2 (the control)", ring)
	}

	// Without warm stores, 0's standby is b (the tie goes to the first);
	// c warm on 0 keeps it, the spread allowing.
	if !slices.Contains(got["b"], 0) {
		t.Fatalf("no warm stores: %v, want 0's standby on b (the control)", got)
	}
	sticky := planStandbys(members, target, map[string][]int32{"c": {0}}, 1)
	if !slices.Contains(sticky["c"], 0) || slices.Contains(sticky["b"], 0) {
		t.Errorf("c warm on 0: %v, want 0 kept on c", sticky)
	}
	// c warm on both of a's: 0 stays there, 2 goes to b (the spread
	// before warmth), where without warm stores 2 went to c.
	spread := planStandbys(members, target, map[string][]int32{"c": {0, 2}}, 1)
	if !slices.Contains(spread["c"], 0) || !slices.Contains(spread["b"], 2) || !slices.Contains(got["c"], 2) {
		t.Errorf("c warm on 0 and 2: %v (without: %v), want 0 on c and 2 on b", spread, got)
	}

	two := planStandbys(members, target, nil, 2)
	for owner, ps := range target {
		for _, p := range ps {
			for _, m := range members {
				if kept := slices.Contains(two[m], p); kept == (m == owner) {
					t.Errorf("two standbys: partition %d (owner %s) on %s: %v", p, owner, m, kept)
				}
			}
		}
	}
	if many := planStandbys(members, target, nil, 5); !slices.Equal(many["a"], two["a"]) || !slices.Equal(many["b"], two["b"]) {
		t.Errorf("five asked of three members: %v, want the two others each (%v)", many, two)
	}
	// Every leader computes the same plan, whatever the members' order.
	if again := planStandbys([]string{"c", "a", "b"}, target, nil, 1); !equalPlans(again, got) {
		t.Errorf("members in another order: %v, want %v", again, got)
	}
}

func equalPlans(a, b map[string][]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for m, ps := range a {
		if !slices.Equal(ps, b[m]) {
			return false
		}
	}
	return true
}

// The balancer writes each member's standbys into its assignment's user
// data, for the target of a cooperative round (a partition withheld
// while its owner revokes it has its standbys placed already), which the
// members read back (decodePlanned); an assignment of another balancer
// carries none.
func TestStandbyBalancerPlansStandbysUnit(t *testing.T) {
	join := func(id string, owned []int32) kmsg.JoinGroupResponseMember {
		b := &standbyBalancer{warm: &atomic.Pointer[[]int32]{}}
		m := kmsg.NewJoinGroupResponseMember()
		m.MemberID, m.ProtocolMetadata = id, b.JoinGroupMetadata([]string{"in"}, map[string][]int32{"in": owned}, 5)
		return m
	}
	b := &standbyBalancer{warm: &atomic.Pointer[[]int32]{}, standbys: 1}
	mb, _, err := b.MemberBalancer([]kmsg.JoinGroupResponseMember{join("a", nil), join("b", []int32{0, 1, 2}), join("c", []int32{3, 4, 5})})
	if err != nil {
		t.Fatal(err)
	}
	into, err := mb.(kgo.GroupMemberBalancerOrError).BalanceOrError(map[string]int32{"in": 6})
	if err != nil {
		t.Fatal(err)
	}
	kept := map[int32]int{}
	// The target: b and c keep two each, a gets 2 and 5 (withheld this
	// round).
	targetOf := map[string][]int32{"a": {2, 5}, "b": {0, 1}, "c": {3, 4}}
	for _, a := range into.IntoSyncAssignment() {
		var ca kmsg.ConsumerMemberAssignment
		if err := ca.ReadFrom(a.MemberAssignment); err != nil {
			t.Fatal(err)
		}
		standbys, ok := decodePlanned(ca.UserData)
		if !ok {
			t.Fatalf("%s's assignment carries no plan: %x", a.MemberID, ca.UserData)
		}
		for _, p := range standbys {
			kept[p]++
			if slices.Contains(targetOf[a.MemberID], p) {
				t.Errorf("%s keeps a standby of %d, which it is to own", a.MemberID, p)
			}
		}
		// This round's: the target but the two withheld (a's).
		round := map[string][]int32{"a": nil, "b": {0, 1}, "c": {3, 4}}[a.MemberID]
		if parts, err := b.ParseSyncAssignment(a.MemberAssignment); err != nil || !slices.Equal(slices.Sorted(slices.Values(parts["in"])), round) {
			t.Errorf("%s is assigned %v (%v), want %v", a.MemberID, parts["in"], err, round)
		}
	}
	for p := range int32(6) {
		if kept[p] != 1 {
			t.Errorf("partition %d has %d standbys, want 1 (withheld ones included)", p, kept[p])
		}
	}
	plain := kgo.CooperativeStickyBalancer()
	cmb, _, err := plain.MemberBalancer([]kmsg.JoinGroupResponseMember{join("a", nil)})
	if err != nil {
		t.Fatal(err)
	}
	cinto, _ := cmb.(kgo.GroupMemberBalancerOrError).BalanceOrError(map[string]int32{"in": 6})
	for _, a := range cinto.IntoSyncAssignment() {
		var ca kmsg.ConsumerMemberAssignment
		if err := ca.ReadFrom(a.MemberAssignment); err != nil {
			t.Fatal(err)
		}
		if _, ok := decodePlanned(ca.UserData); ok {
			t.Errorf("cooperative-sticky's assignment reads as a plan: %x", ca.UserData)
		}
	}
}
