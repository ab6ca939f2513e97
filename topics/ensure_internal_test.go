package topics

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
)

func TestConflictsNamesEverySettingThatDiffers(t *testing.T) {
	s := Spec{Name: "positions", Partitions: 1, ReplicationFactor: 3, Configs: map[string]string{"cleanup.policy": "compact", "min.insync.replicas": "2"}}
	have := shape{partitions: 4, rf: 1, configs: map[string]string{"cleanup.policy": "delete", "min.insync.replicas": "2"}}
	errs := conflicts(s, have)
	var got []string
	for _, err := range errs {
		ce, ok := errors.AsType[*ConflictError](err)
		if !ok || !errors.Is(err, ErrConflict) {
			t.Fatalf("%v is no *ConflictError matching ErrConflict", err)
		}
		got = append(got, ce.Setting+"="+ce.Have)
	}
	want := []string{"partitions=4", "replication factor=1", "cleanup.policy=delete"}
	if len(got) != len(want) {
		t.Fatalf("conflicts %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("conflicts %v, want %v", got, want)
		}
	}
}

func TestConflictsAcceptsTheSameShapeAndDefaults(t *testing.T) {
	have := shape{partitions: 6, rf: 3, configs: map[string]string{"cleanup.policy": "delete,compact"}}
	for _, s := range []Spec{
		{Name: "t"}, // partitions and RF at the broker's default accept any
		{Name: "t", Partitions: 6, ReplicationFactor: 3},
		{Name: "t", Configs: map[string]string{"cleanup.policy": "compact, delete"}}, // a set
	} {
		if errs := conflicts(s, have); len(errs) > 0 {
			t.Errorf("%+v: conflicts %v, want none", s, errs)
		}
	}
	if errs := conflicts(Spec{Name: "t", Configs: map[string]string{"cleanup.policy": "compact"}}, have); len(errs) != 1 {
		t.Errorf("compact against compact,delete: conflicts %v, want one", errs)
	}
}

func TestValidateRefusesUnnamedDuplicateAndNegativeSpecs(t *testing.T) {
	for _, specs := range [][]Spec{{{}}, {{Name: "a"}, {Name: "a"}}, {{Name: "a", Partitions: -1}}, {{Name: "a", ReplicationFactor: -2}}} {
		if _, err := validate(specs); err == nil {
			t.Errorf("validate(%+v) = nil, want an error", specs)
		}
	}
}

// The replication factor of a topic is its weakest partition's, and a
// topic whose partition 0 is missing from the answer still has one.
func TestShapeOfTakesTheSmallestReplicationFactor(t *testing.T) {
	td := kadm.TopicDetail{Partitions: kadm.PartitionDetails{
		1: {Partition: 1, Replicas: []int32{1, 2, 3}},
		2: {Partition: 2, Replicas: []int32{1, 2}},
	}}
	if sh := shapeOf(td); sh.rf != 2 || sh.partitions != 2 {
		t.Fatalf("shapeOf = %+v, want 2 partitions at RF 2", sh)
	}
}
