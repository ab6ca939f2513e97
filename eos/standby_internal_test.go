package eos

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/state"
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

// A standby taken over (takeStandby) while its catch-up runs: the
// catch-up's later writes fail as on a closed store (the restorer gives
// up) and leave the store as the takeover found it; a catch-up that
// wipes a standby makes it neither readable as stale nor warm; a
// standby dropped while a restore takes it over is the restore's, and
// one dropped first is closed, and a takeover then opens afresh.
func TestAStandbyTakenOverRefusesItsCatchUpUnit(t *testing.T) {
	ks := newKeyedState(&stateConfig{}, "in", slog.New(slog.DiscardHandler))
	sb := newStandby(state.NewMemory(), true)
	sb.caughtAt = time.Now()
	ks.standbys[3] = sb
	f := followed{sb.store, sb, ks, 3}
	write := func(v string, at int64) error {
		return f.Apply([]state.Write{{Key: []byte("k"), Value: []byte(v)}}, state.Checkpoint{Offset: at})
	}
	if err := write("1", 1); err != nil {
		t.Fatal(err)
	}
	if err := f.Reset(state.Checkpoint{}); err != nil || !sb.caughtAt.IsZero() || sb.caught {
		t.Fatalf("a wipe: %v, caught at %v, warm %v; want unreadable and not warm", err, sb.caughtAt, sb.caught)
	}
	if err := write("2", 2); err != nil {
		t.Fatal(err)
	}
	store, ok := ks.takeStandby(3)
	if !ok || store != sb.store {
		t.Fatalf("takeStandby: %v, %v", store, ok)
	}
	if err := write("3", 3); !errors.Is(err, errStandbyGone) || !errors.Is(err, state.ErrClosed) {
		t.Fatalf("a write after the takeover: %v, want errStandbyGone, a closed store", err)
	}
	if v, _, _ := store.Get([]byte("k")); string(v) != "2" || store.Checkpoint().Offset != 2 {
		t.Fatalf("the store after the takeover: %q at %d, want 2 at 2", v, store.Checkpoint().Offset)
	}

	// Dropped after a restore took it: the restore's, left open.
	taken := newStandby(state.NewMemory(), true)
	ks.standbys[4] = taken
	if _, ok := ks.takeStandby(4); !ok {
		t.Fatal("takeStandby of 4")
	}
	ks.dropStandby(4, taken)
	if _, _, err := taken.store.Get([]byte("k")); err != nil {
		t.Fatalf("a standby taken over, then dropped: %v, want it open (the restore's)", err)
	}
	// Dropped first: closed, and a takeover finds none.
	dropped := newStandby(state.NewMemory(), true)
	ks.standbys[5] = dropped
	ks.dropStandby(5, dropped)
	if _, ok := ks.takeStandby(5); ok {
		t.Fatal("a standby dropped and closed was taken over")
	}
	if _, _, err := dropped.store.Get([]byte("k")); !errors.Is(err, state.ErrClosed) {
		t.Fatalf("a standby dropped: %v, want it closed", err)
	}
}
