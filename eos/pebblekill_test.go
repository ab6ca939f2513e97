package eos_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/state/pebblestore"
)

// restores records each restore a processor reports (eos.RestoreMetrics).
type restores struct {
	eoskit.Metrics
	mu   sync.Mutex
	from map[int32]int64
	read int
}

func (r *restores) Restored(_ string, partition int32, from int64, records int, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.from[partition] = from
	r.read += records
}

// A counter on pebble stores SIGKILLed mid-stream, restarted on the same
// directory: its stores' checkpoints survived the kill (pebble's log is
// synced once a second), so the restart restores each partition from its
// checkpoint, reading only the changelog's tail, not the whole (before,
// an unsynced log lost up to its last 32 KiB with the process, and a
// quiet store restored from 0). Asserted through eos.RestoreMetrics, not
// the logs; and the totals are exact.
func TestPebbleRestoresOnlyTheTailAfterASIGKILL(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, updates := k.NewTopic(4), k.NewTopic(4)
	changelog := newChangelog(t, k, 4)
	group := integration.UniqueName(t, "pebble-kill")
	dir := t.TempDir()
	want := seedReports(t, k, in, 20_000)

	victim := startCopier(t, k, eos.ExactlyOnce, in, updates, group, group+"-0", "EOS_COPIER_CHANGELOG="+changelog, "EOS_COPIER_PEBBLE="+dir)
	waitFor(t, 2*time.Minute, "every changelog partition to hold a committed transaction", func() bool {
		lso, err := k.Admin.ListCommittedOffsets(context.Background(), changelog)
		n := 0
		lso.Each(func(o kadm.ListedOffset) {
			if o.Offset > 0 {
				n++
			}
		})
		return err == nil && n == 4
	})
	time.Sleep(2 * time.Second) // past a sync of each store's log
	victim.kill()
	hwm, _ := endOffsets(t, k.Admin, changelog)

	m := &restores{Metrics: eoskit.NopMetrics{}, from: map[int32]int64{}}
	a := startProcessor(t, eos.Count(), append(statefulOpts(k, group, in, changelog, updates, "0"),
		eos.Changelog(changelog, eos.EmitUpdates(updates), eos.Stores(pebblestore.Factory(dir, nil))), eos.WithMetrics(m))...)
	waitForTotals(t, k, updates, want, 3*time.Minute)
	if err := a.stop(t); err != nil {
		t.Fatalf("stopped with %v", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.from) != 4 {
		t.Fatalf("%d partitions restored, want 4", len(m.from))
	}
	for p, from := range m.from {
		if from == 0 {
			t.Errorf("partition %d restored from 0: its checkpoint did not survive the kill", p)
		}
	}
	if int64(m.read) >= hwm {
		t.Fatalf("the restart restored %d of the %d changelog records written before the kill: all of them", m.read, hwm)
	}
	t.Logf("restored %d of %d changelog records, from %v", m.read, hwm, m.from)
}
