package eoskit_test

import (
	"testing"
	"time"

	"github.com/eoskit/eoskit"
)

// A runner restoring state is healthy but not ready: a view of its state
// would leave the restoring partitions out.
func TestARunnerRestoringIsNotReady(t *testing.T) {
	h := eoskit.Health{Running: true, Joined: true, Restoring: map[string][]int32{"in": {2}}}
	if !h.Healthy() || h.Ready() {
		t.Fatalf("healthy %v, ready %v; want healthy and not ready", h.Healthy(), h.Ready())
	}
	h.Restoring = nil
	if !h.Ready() {
		t.Fatal("not ready once restored")
	}
}

// Worst answers the first runner that is not ready or not healthy, else
// the first.
func TestWorstAnswersTheFirstRunnerNotReady(t *testing.T) {
	ready := eoskit.Health{Path: "a", Running: true, Joined: true}
	joining := eoskit.Health{Path: "b", Running: true}
	stopped := eoskit.Health{Path: "c"}
	failing := eoskit.Health{Path: "d", Running: true, Joined: true, LastError: "x", LastErrorAt: time.Now()}
	for _, c := range []struct {
		hs   []eoskit.Health
		want string
	}{
		{[]eoskit.Health{ready, ready}, "a"},
		{[]eoskit.Health{ready, joining, stopped}, "c"}, // not healthy before not ready
		{[]eoskit.Health{ready, joining}, "b"},
		{[]eoskit.Health{ready, stopped}, "c"},
		{[]eoskit.Health{ready, failing}, "d"},
		{nil, ""},
	} {
		if got := eoskit.Worst(c.hs...).Path; got != c.want {
			t.Errorf("Worst of %d: %q, want %q", len(c.hs), got, c.want)
		}
	}
}
