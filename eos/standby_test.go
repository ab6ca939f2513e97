package eos_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/state/pebblestore"
	"github.com/eoskit/eoskit/verify"
)

// A counter process fails on a real broker: SIGKILLed inside a
// transaction, stopped by SIGTERM as a rolling deploy does, or stopped
// (SIGSTOP) inside a transaction past its session timeout and woken
// once its partitions moved (a zombie, then stopped by SIGTERM). The
// instance that takes its partitions over restores only the changelog's
// tail when it kept standbys of them (eos.Standbys(1), both advertising
// an endpoint), and the whole changelog of those partitions without;
// with its stores on pebble too. Before the fault, with the input
// quiet, the survivor's standby stores hold what the changelog of their
// partitions holds, read back from outside. Reports over 400 regions
// keep coming from transactional producers that also abort, over four
// partitions, before, during and after the fault. The counts end exact
// every way (the updates topic and the changelog, read back
// read_committed, at the truth of the committed input, each key's counts
// only growing; the survivor's view too). make test runs the SIGKILLs
// (memory and pebble stores, and the control); the SIGTERM and the
// zombie, 30-50 s of make test's time each, run in make chaos alone, and
// make test has no other real-broker test of either handing partitions
// to a standby (TestALeaversPartitionsGoToTheirStandbys is a leave on
// kfake).
func TestAStandbyTakesOverAKilledInstancesPartitionsWithTheTail(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		standbys int
		pebble   bool
		fault    string
		chaos    bool // make chaos's alone
	}{{1, false, "kill", false}, {1, true, "kill", false}, {0, false, "kill", false}, {1, false, "term", true}, {1, false, "zombie", true}} {
		standbys := c.standbys
		name := c.fault + ",standbys=" + strconv.Itoa(standbys)
		if c.pebble {
			name += ",pebble"
		}
		t.Run(name, func(t *testing.T) {
			if c.chaos {
				chaosSuite(t, "make test runs its SIGKILL cases")
			}
			t.Parallel()
			if c.fault == "zombie" && pauseSignal < 0 {
				t.Skip("no SIGSTOP on this platform")
			}
			k := integration.Kafka(t)
			in, updates := k.NewTopic(4), k.NewTopic(4)
			changelog := newChangelog(t, k, 4)
			group := integration.UniqueName(t, "standby")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()

			// The reports, 400 at a time (and 400 aborted), until stopped;
			// none while quiet is held.
			stopProducing, produced := make(chan struct{}), make(chan error, 1)
			var quiet sync.Mutex
			go func() {
				for {
					select {
					case <-stopProducing:
						produced <- nil
						return
					default:
					}
					quiet.Lock()
					_, _, err := integration.SeedTransactional(ctx, k.Brokers, in, 400, 100, func(r *kgo.Record) {
						id := string(r.Value)
						i, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
						r.Key = []byte("region-" + strconv.Itoa(i%400))
					})
					quiet.Unlock()
					if err != nil {
						produced <- err
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()

			// A transaction the kill leaves open on the changelog holds
			// the takeover's restore until the broker aborts it: 10 s.
			env := []string{"EOS_COPIER_CHANGELOG=" + changelog, "EOS_COPIER_TXN_TIMEOUT=10s"}
			if standbys > 0 {
				env = append(env, "EOS_COPIER_STANDBYS="+strconv.Itoa(standbys))
			}
			victim := startCopier(t, k, eos.ExactlyOnce, in, updates, group, group+"-victim", env...)
			// The victim holds every partition before the survivor
			// joins: the survivor never held the victim's partitions, so
			// no store of them is parked there (it would restore from it).
			waitFor(t, time.Minute, "the victim to commit on every partition", func() bool {
				offsets, err := k.Admin.FetchOffsets(ctx, group)
				n := 0
				offsets.Each(func(o kadm.OffsetResponse) {
					if o.At > 0 {
						n++
					}
				})
				return err == nil && n == 4
			})
			restores := &restoreLog{Metrics: eoskit.NopMetrics{}}
			stateOpts := []eos.StateOption{eos.Standbys(standbys)}
			if c.pebble {
				// The survivor's stores, its standbys' among them, on disk.
				stateOpts = append(stateOpts, eos.Stores(pebblestore.Factory(t.TempDir(), nil)))
			}
			a := startProcessor(t, eos.Count(), append(statefulOpts(k, group, in, changelog, updates, "0", stateOpts...),
				eos.Endpoint("http://survivor.example:8080"), eos.WithMetrics(restores))...)
			waitFor(t, 2*time.Minute, "the two instances to split the partitions", func() bool { return len(a.p.State().Partitions()) == 2 })
			split := restores.count() // the survivor's restores of its share
			held := a.p.State().Partitions()
			var taken []int32 // the victim's
			for p := range int32(4) {
				if !slices.Contains(held, p) {
					taken = append(taken, p)
				}
			}
			if standbys > 0 {
				waitFor(t, time.Minute, "the survivor to keep standbys of the victim's partitions", func() bool {
					return slices.Equal(a.p.State().Standbys(), taken)
				})
				// The input quiet, every report counted, two catch-ups
				// later: the standbys hold what the changelog does.
				quiet.Lock()
				waitForTotals(t, k, updates, committedCounts(t, ctx, k, in), time.Minute)
				time.Sleep(2500 * time.Millisecond)
				standbysHoldTheChangelog(t, ctx, k, a.p.State(), changelog)
				quiet.Unlock()
			}
			// The victim counts a while (its commits, two seconds apart,
			// grow its partitions' changelog), and fails, in a
			// transaction unless stopped by SIGTERM.
			time.Sleep(8 * time.Second)
			// Its changelog partitions are its alone: a transaction open
			// there is the victim's.
			waitFor(t, time.Minute, "an open transaction of the victim", func() bool {
				hwm, lso := endOffsets(t, k.Admin, changelog, taken...)
				return hwm > lso
			})
			before := restores.count()
			// Both members alive, the split never moves: a move means a
			// session ended (the survivor would then hold stores of the
			// victim's partitions, and the takeover prove nothing).
			if now := a.p.State().Partitions(); !slices.Equal(now, held) {
				moved, _ := restores.since(split)
				t.Fatalf("before the fault the survivor holds %v, having held %v at the split (restoring %v since): the split moved, so a member's session ended with both alive", now, held, moved)
			}
			// Where the victim's open transaction begins, at most.
			stable, err := k.Admin.ListCommittedOffsets(ctx, changelog)
			if err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			switch c.fault {
			case "kill":
				victim.kill()
			case "term":
				victim.signal(t, syscall.SIGTERM)
				if err := victim.wait(t, time.Minute); err != nil {
					t.Fatalf("the victim exited on SIGTERM with %v, want 0 (a drain)", err)
				}
			case "zombie":
				victim.signal(t, pauseSignal)
			}
			// What the victim left in its partitions' changelog: all a
			// whole restore reads (the survivor writes there once it
			// took them over).
			ends, err := k.Admin.ListEndOffsets(ctx, changelog)
			if err != nil {
				t.Fatal(err)
			}
			// The records in the victim's partitions between the two:
			// its transaction left open.
			inOpen := func(pos verify.Position) bool {
				from, _ := stable.Lookup(changelog, pos.Partition)
				to, _ := ends.Lookup(changelog, pos.Partition)
				return slices.Contains(taken, pos.Partition) && pos.Offset >= from.Offset && pos.Offset < to.Offset
			}
			waitFor(t, time.Minute, "the survivor to take the victim's partitions", func() bool { return len(a.p.State().Partitions()) == 4 })
			tookOver := time.Since(killed)
			parts, read := restores.since(before)
			for _, p := range taken {
				if !slices.Contains(parts, p) {
					// A restore is reported before its partition is
					// readable (RestoreMetrics).
					t.Fatalf("the survivor holds every partition, having restored %v (%d records) since the fault, want the victim's %v among them", parts, read, taken)
				}
			}
			var whole int64
			for _, p := range taken {
				o, _ := ends.Lookup(changelog, p)
				whole += o.Offset
			}
			t.Logf("%s, standbys %d: taking over %v, %s after the fault (a 6 s session timeout; a 10 s transaction timeout for the one it left open), read %d changelog records of %d in those partitions",
				c.fault, standbys, taken, tookOver.Round(100*time.Millisecond), read, whole)
			switch {
			case standbys > 0 && int64(read)*4 > whole:
				t.Errorf("with a standby the takeover read %d of %d changelog records: more than the tail", read, whole)
			case standbys == 0 && int64(read)*2 < whole:
				t.Errorf("without a standby the takeover read %d of %d changelog records: the test cannot tell standbys apart", read, whole)
			}
			if c.fault == "zombie" {
				// It wakes, its transaction open and its generation past
				// (fenced, or rejoining to count on as the group lets
				// it), and is stopped.
				victim.signal(t, wakeSignal)
				time.Sleep(6 * time.Second)
				victim.signal(t, syscall.SIGTERM)
				t.Logf("the zombie exited with %v", victim.wait(t, time.Minute))
				waitFor(t, time.Minute, "the survivor to hold every partition again", func() bool { return len(a.p.State().Partitions()) == 4 })
			}

			time.Sleep(2 * time.Second) // reports counted by the survivor alone
			close(stopProducing)
			if err := <-produced; err != nil {
				t.Fatal(err)
			}
			want := committedCounts(t, ctx, k, in)
			waitForTotals(t, k, updates, want, 2*time.Minute)
			waitFor(t, time.Minute, "the survivor's view to show the totals", func() bool { return maps.Equal(viewOf(t, a.p.State()), want) })
			if err := a.stop(t); err != nil {
				t.Fatalf("the survivor stopped with %v", err)
			}
			for _, topic := range []string{updates, changelog} {
				if got := lastValues(t, k, topic, true); !maps.Equal(got, want) {
					t.Errorf("%s ends at %d keys' counts, not the %d true ones", topic, len(got), len(want))
				}
			}
			// The kill landed inside a transaction: the broker aborted
			// what it had written to the victim's changelog partitions.
			if c.fault == "kill" {
				aborted := 0
				for pos := range verify.AbortedPositions(k.ReadRaw(changelog, verifyTimeout)) {
					if inOpen(pos) {
						aborted++
					}
				}
				if aborted == 0 {
					t.Error("the victim's changelog partitions hold no aborted record past the kill's stable offset: the kill did not land inside a transaction")
				}
			}
		})
	}
}

// standbysHoldTheChangelog asserts that the standby stores of view hold,
// read stale, each key's last value in their changelog partitions, read
// back read_committed from outside, and no other key.
func standbysHoldTheChangelog(t *testing.T, ctx context.Context, k *integration.KafkaCluster, view *eos.StateView, changelog string) {
	t.Helper()
	want := map[string]string{}
	for key, v := range lastValues(t, k, changelog, true) {
		p, err := view.PartitionOf([]byte(key))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(view.Standbys(), p) {
			want[key] = v
		}
	}
	got := map[string]string{}
	for _, p := range view.Standbys() {
		if _, err := view.StandbyScan(ctx, p, nil, nil, func(k, v []byte) bool {
			got[string(k)] = string(v)
			return true
		}); err != nil {
			t.Fatalf("standby of partition %d: %v", p, err)
		}
	}
	if len(want) == 0 || !maps.Equal(got, want) {
		t.Fatalf("the standbys of %v hold %d keys, the changelog %d (equal: %v)", view.Standbys(), len(got), len(want), maps.Equal(got, want))
	}
}

// committedCounts counts the committed records of topic by key.
func committedCounts(t *testing.T, ctx context.Context, k *integration.KafkaCluster, topic string) map[string]string {
	t.Helper()
	recs, err := verify.ReadTopic(ctx, k.Brokers, topic, kgo.ReadCommitted(), true, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, r := range recs {
		n[string(r.Key)]++
	}
	want := map[string]string{}
	for key, c := range n {
		want[key] = strconv.Itoa(c)
	}
	return want
}
