package eos

import (
	"errors"
	"slices"
	"testing"

	"github.com/eoskit/eoskit"
)

func TestStandbyPartitionsFollowTheOwnerUnit(t *testing.T) {
	owners := map[int32]string{0: "a", 1: "a", 2: "b", 3: "c", 4: "", 5: "gone"}
	members := []string{"a", "b", "c"}
	for _, c := range []struct {
		self string
		n    int
		want []int32
	}{
		{"a", 1, nil},              // 2 (b's) goes 1 after b, to c; 3 (c's) 2 after c, to b
		{"b", 1, []int32{0, 3}},    // 0 (a's): 1+0%2 = 1 after a; 3 (c's): 1+3%2 = 2 after c
		{"c", 1, []int32{1, 2}},    // 1 (a's): 2 after a; 2 (b's): 1 after b
		{"a", 2, []int32{2, 3}},    // a is 2nd after b, 1st after c
		{"b", 5, []int32{0, 1, 3}}, // n past the members: every other's
		{"d", 1, nil},              // not a member
		{"a", 0, nil},
	} {
		if got := standbyPartitions(owners, members, c.self, c.n); !slices.Equal(got, c.want) {
			t.Errorf("standbyPartitions(%s, %d) = %v, want %v", c.self, c.n, got, c.want)
		}
	}
	// A partition changing owners moves its own standby only, not those
	// of its old or new owner's other partitions.
	moved := map[int32]string{0: "a", 1: "a", 2: "b", 3: "a"}
	for _, self := range members {
		before, after := standbyPartitions(owners, members, self, 1), standbyPartitions(moved, members, self, 1)
		before, after = slices.DeleteFunc(before, func(p int32) bool { return p == 3 }), slices.DeleteFunc(after, func(p int32) bool { return p == 3 })
		if !slices.Equal(before, after) {
			t.Errorf("%s: standbys %v before 3 moved, %v after", self, before, after)
		}
	}
}

func TestStandbysRefusals(t *testing.T) {
	base := []ProcessorOption{Brokers("localhost:1"), Group("g"), Topics("in"), TransactionalID("x")}
	for name, opts := range map[string][]ProcessorOption{
		"no endpoint": {Changelog("c", Standbys(1))},
		"negative":    {Changelog("c", Standbys(-1)), Endpoint("http://a.example:8080")},
	} {
		_, err := NewProcessor(Count(), append(slices.Clone(base), opts...)...)
		var ce *eoskit.ConfigError
		if !errors.As(err, &ce) || ce.Setting != "Standbys" {
			t.Errorf("%s: %v, want a ConfigError for Standbys", name, err)
		}
	}
}
