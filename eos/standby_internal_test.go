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
		{"a", 1, []int32{3}},       // c's first partition: the 1st after c
		{"b", 1, []int32{0}},       // a's first: the 1st after a
		{"c", 1, []int32{1, 2}},    // a's second (the 2nd after a), b's first
		{"a", 2, []int32{2, 3}},    // a is 2nd after b, 1st after c
		{"b", 5, []int32{0, 1, 3}}, // n past the members: every other's
		{"d", 1, nil},              // not a member
		{"a", 0, nil},
	} {
		if got := standbyPartitions(owners, members, c.self, c.n); !slices.Equal(got, c.want) {
			t.Errorf("standbyPartitions(%s, %d) = %v, want %v", c.self, c.n, got, c.want)
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
