package eos_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
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

// A counter process, SIGKILLed inside a transaction, on a real broker:
// the instance that takes its partitions over restores only the
// changelog's tail when it kept standbys of them (eos.Standbys(1), both
// advertising an endpoint), and the whole changelog of those partitions
// without; with its stores on pebble too. Reports over 400 regions keep coming from transactional
// producers that also abort, over four partitions, before, during and
// after the kill. The counts end exact either way (the updates topic and
// the changelog, read back read_committed, at the truth of the committed
// input, each key's counts only growing; the survivor's view too).
func TestAStandbyTakesOverAKilledInstancesPartitionsWithTheTail(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		standbys int
		pebble   bool
	}{{1, false}, {1, true}, {0, false}} {
		standbys := c.standbys
		name := "standbys=" + strconv.Itoa(standbys)
		if c.pebble {
			name += ",pebble"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k := integration.Kafka(t)
			in, updates := k.NewTopic(4), k.NewTopic(4)
			changelog := newChangelog(t, k, 4)
			group := integration.UniqueName(t, "standby")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()

			// The reports, 400 at a time (and 400 aborted), until stopped.
			stopProducing, produced := make(chan struct{}), make(chan error, 1)
			go func() {
				for {
					select {
					case <-stopProducing:
						produced <- nil
						return
					default:
					}
					if _, _, err := integration.SeedTransactional(ctx, k.Brokers, in, 400, 100, func(r *kgo.Record) {
						id := string(r.Value)
						i, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
						r.Key = []byte("region-" + strconv.Itoa(i%400))
					}); err != nil {
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
			var taken []int32
			for p := range int32(4) {
				if !slices.Contains(a.p.State().Partitions(), p) {
					taken = append(taken, p)
				}
			}
			if standbys > 0 {
				waitFor(t, time.Minute, "the survivor to keep standbys of the victim's partitions", func() bool {
					return slices.Equal(a.p.State().Standbys(), taken)
				})
			}
			// The victim counts a while (its commits, two seconds apart,
			// grow its partitions' changelog), and dies in a transaction.
			time.Sleep(8 * time.Second)
			// Its changelog partitions are its alone: a transaction open
			// there is the victim's.
			waitFor(t, time.Minute, "an open transaction of the victim", func() bool {
				hwm, lso := endOffsets(t, k.Admin, changelog, taken...)
				return hwm > lso
			})
			before := restores.count()
			killed := time.Now()
			victim.kill()
			// What the victim left in its partitions' changelog: all a
			// whole restore reads (the survivor writes there once it
			// took them over).
			ends, err := k.Admin.ListEndOffsets(ctx, changelog)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, time.Minute, "the survivor to take the victim's partitions", func() bool { return len(a.p.State().Partitions()) == 4 })
			tookOver := time.Since(killed)
			parts, read := restores.since(before)
			for _, p := range taken {
				if !slices.Contains(parts, p) {
					t.Fatalf("the survivor restored %v taking over, want the victim's %v among them", parts, taken)
				}
			}
			var whole int64
			for _, p := range taken {
				o, _ := ends.Lookup(changelog, p)
				whole += o.Offset
			}
			t.Logf("standbys %d: taking over %v, %s after the kill (a 6 s session timeout; a 10 s transaction timeout for the one it left open), read %d changelog records of %d in those partitions",
				standbys, taken, tookOver.Round(100*time.Millisecond), read, whole)
			switch {
			case standbys > 0 && int64(read)*4 > whole:
				t.Errorf("with a standby the takeover read %d of %d changelog records: more than the tail", read, whole)
			case standbys == 0 && int64(read)*2 < whole:
				t.Errorf("without a standby the takeover read %d of %d changelog records: the test cannot tell standbys apart", read, whole)
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
		})
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
