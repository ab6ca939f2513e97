package eos_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/state/pebblestore"
)

// regions is how many keys the counting tests count by.
const regions = 40

// regionOf is the key of input id ("in-7", "aborted-7"): region-(n % regions).
func regionOf(id string) string {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	return "region-" + strconv.Itoa(n%regions)
}

// seedReports writes n reports keyed by region from a transactional
// producer that aborts a transaction of as many after each it commits,
// over in's partitions, and returns the true count per region (the
// committed ones only).
func seedReports(t *testing.T, k *integration.KafkaCluster, in string, n int) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	committed, aborted, err := integration.SeedTransactional(ctx, k.Brokers, in, n, 500, func(r *kgo.Record) {
		r.Key = []byte(regionOf(string(r.Value)))
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(aborted) == 0 {
		t.Fatal("no aborted input")
	}
	counts := map[string]int{}
	for _, id := range committed {
		counts[regionOf(id)]++
	}
	want := map[string]string{}
	for r, c := range counts {
		want[r] = strconv.Itoa(c)
	}
	return want
}

// newChangelog creates a compacted changelog of partitions partitions.
func newChangelog(t *testing.T, k *integration.KafkaCluster, partitions int32) string {
	topic := integration.UniqueName(t, "changelog")
	compact := "compact"
	k.CreateTopic(topic, partitions, map[string]*string{"cleanup.policy": &compact})
	return topic
}

// lastValues reads topic read_committed and returns each key's last
// value (none for a key whose last record is a tombstone), failing the
// test, if strict, when a key's counts ever fail to grow (an update of an
// aborted transaction, or one counted twice, shows as a count repeated
// or going back).
func lastValues(t *testing.T, k *integration.KafkaCluster, topic string, strict bool) map[string]string {
	t.Helper()
	last := map[string]string{}
	prev := map[string]int64{}
	for _, r := range k.ReadAll(topic, kgo.ReadCommitted(), verifyTimeout) {
		if state.IsReserved(r.Key) {
			continue // a windowed count's stream time, per partition
		}
		key := string(r.Key)
		if r.Value == nil { // deleted (a TTL's expiry)
			delete(last, key)
			delete(prev, key)
			continue
		}
		n, err := state.Int64(r.Value)
		if err != nil {
			t.Fatalf("%s: key %s holds %q: %v", topic, key, r.Value, err)
		}
		if strict && n <= prev[key] {
			t.Fatalf("%s: key %s went from %d to %d at %s[%d]@%d: an update seen twice, or one of an aborted transaction",
				topic, key, prev[key], n, topic, r.Partition, r.Offset)
		}
		prev[key] = n
		last[key] = string(r.Value)
	}
	return last
}

func statefulOpts(k *integration.KafkaCluster, group, in, changelog, updates, instance string, extra ...eos.StateOption) []eos.ProcessorOption {
	return append(processorOpts(k, group, in, instance),
		eos.Changelog(changelog, append([]eos.StateOption{eos.EmitUpdates(updates)}, extra...)...))
}

// The dashboard's totals, counted by eos.Count with its changelog in the
// transaction, are exact after: a counter process SIGKILLed while its
// transaction holds changelog records, its replacement restoring the
// partitions from the changelog, a second instance joining (a rebalance:
// partitions revoked, and restored on the other), then leaving. Inputs
// come from a transactional producer that also aborts, over four
// partitions. Checked from outside: the updates topic and the changelog,
// read back read_committed, end at the true totals, each key's counts only
// growing (nothing counted twice, nothing of an aborted transaction seen);
// each instance's StateView, while it runs, holds only true totals.
func TestCountIsExactThroughCrashesAndRebalances(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, updates := k.NewTopic(4), k.NewTopic(4)
	changelog := newChangelog(t, k, 4)
	group := integration.UniqueName(t, "g")
	want := seedReports(t, k, in, 20_000)

	victim := startCopier(t, k, eos.ExactlyOnce, in, updates, group, group+"-0", "EOS_COPIER_CHANGELOG="+changelog)
	waitFor(t, 2*time.Minute, "an open transaction with changelog records", func() bool {
		hwm, lso := endOffsets(t, k.Admin, changelog)
		return hwm > lso && lso > 0
	})
	victim.kill()
	hwm, lso := endOffsets(t, k.Admin, changelog)
	t.Logf("killed the counter with the changelog's high watermarks at %d, last stable offsets at %d", hwm, lso)

	a := startProcessor(t, eos.Count(), statefulOpts(k, group, in, changelog, updates, "0")...)
	waitFor(t, 2*time.Minute, "the replacement to restore and count", func() bool { return len(a.p.State().Partitions()) > 0 })
	b := startProcessor(t, eos.Count(), statefulOpts(k, group, in, changelog, updates, "1")...)
	countEndsAtTotals(t, k, a, b, want, updates, changelog)
}

// countEndsAtTotals waits until b, a counting instance that joined a's
// group, holds partitions, checks both views hold no count above its
// total, stops b and waits for the totals, then stops a and checks that
// the updates and the changelog, read back read_committed, end at the
// totals with each key's counts only growing.
func countEndsAtTotals(t *testing.T, k *integration.KafkaCluster, a, b *running, want map[string]string, updates, changelog string) {
	t.Helper()
	waitFor(t, 2*time.Minute, "the second instance to hold partitions", func() bool { return len(b.p.State().Partitions()) > 0 })
	checkView(t, want, a.p.State(), b.p.State())
	if err := b.stop(t); err != nil {
		t.Fatalf("instance 1 stopped with %v", err)
	}
	waitForTotals(t, k, updates, want, 3*time.Minute)
	// Instance 0 holds every partition again: its view is the totals.
	waitFor(t, time.Minute, "instance 0's view to show the totals", func() bool { return maps.Equal(viewOf(t, a.p.State()), want) })
	if err := a.stop(t); err != nil {
		t.Fatalf("instance 0 stopped with %v", err)
	}
	for _, topic := range []string{updates, changelog} {
		if got := lastValues(t, k, topic, true); !maps.Equal(got, want) {
			t.Fatalf("%s ends at %v, want %v", topic, got, want)
		}
	}
}

// waitForTotals waits until the updates topic's last values are the true
// totals, and fails the test naming the keys that differ if they are not
// within timeout.
func waitForTotals(t *testing.T, k *integration.KafkaCluster, updates string, want map[string]string, timeout time.Duration) {
	t.Helper()
	var got map[string]string
	deadline := time.Now().Add(timeout)
	for {
		if got = lastValues(t, k, updates, false); maps.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	var diff []string
	for key, w := range want {
		if got[key] != w {
			diff = append(diff, fmt.Sprintf("%s: %s, want %s", key, got[key], w))
		}
	}
	for key, g := range got {
		if _, ok := want[key]; !ok {
			diff = append(diff, fmt.Sprintf("%s: %s, want none", key, g))
		}
	}
	slices.Sort(diff)
	t.Fatalf("the updates of %s are not the totals after %s: %d keys differ: %s", updates, timeout, len(diff), strings.Join(diff, "; "))
}

// viewOf returns what v holds, key by key.
func viewOf(t *testing.T, v *eos.StateView) map[string]string {
	t.Helper()
	got := map[string]string{}
	if err := v.Range(func(_ int32, key, value []byte) bool { got[string(key)] = string(value); return true }); err != nil {
		t.Fatal(err)
	}
	return got
}

// checkView fails the test if a view holds a count above its true total
// (a count may trail while records are still being counted, never pass).
func checkView(t *testing.T, want map[string]string, views ...*eos.StateView) {
	t.Helper()
	for i, v := range views {
		err := v.Range(func(p int32, key, value []byte) bool {
			got, _ := strconv.Atoi(string(value))
			total, _ := strconv.Atoi(want[string(key)])
			if got > total {
				t.Errorf("view %d: %s in partition %d counts %d, above its true total %d", i, key, p, got, total)
			}
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// A record whose handler wrote state and then failed leaves no write: it
// goes to the dead-letter topic, and the transaction commits the others'
// writes without its own. Two failures: the handler's error after its
// count (ids ending in 7), and a write too large for the updates topic
// (ids ending in 3), whose limit is below the changelog's: its
// max.message.bytes, or the producer's batch limit for that topic alone
// (kgo.ProducerBatchMaxBytesFn). The handler's Put fails with
// state.ErrTooLarge, the record's fault, where the updates record would
// otherwise fail the whole transaction and the session would restart
// until Run gave up.
func TestAFailedRecordLeavesNoStateWrite(t *testing.T) {
	t.Parallel()
	t.Run("topic limit", func(t *testing.T) { failedRecordLeavesNoStateWrite(t, "topic") })
	t.Run("producer limit for the topic", func(t *testing.T) { failedRecordLeavesNoStateWrite(t, "batch") })
	t.Run("produce request limit", func(t *testing.T) { failedRecordLeavesNoStateWrite(t, "request") })
}

// failedRecordLeavesNoStateWrite counts with writes of 6,000 bytes that
// the limit of the updates topic refuses: its max.message.bytes (limit
// "topic"), the producer's batch limit for it ("batch"), or the
// producer's request limit, kgo.BrokerMaxWriteBytes, under batch limits
// that would take them ("request").
func failedRecordLeavesNoStateWrite(t *testing.T, limit string) {
	t.Parallel()
	k := integration.Kafka(t)
	in, dlt := k.NewTopic(2), k.NewTopic(1)
	updates := integration.UniqueName(t, "updates")
	var configs map[string]*string
	var clientOpts []kgo.Opt
	switch small := "4096"; limit {
	case "topic":
		configs = map[string]*string{"max.message.bytes": &small}
	case "batch":
		clientOpts = append(clientOpts, kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
			if topic == updates {
				return 4096
			}
			return 1_000_012 // kgo's default
		}))
	case "request":
		// kgo refuses a batch limit above the request limit only for
		// the function's answer for no topic.
		clientOpts = append(clientOpts, kgo.BrokerMaxWriteBytes(5000), kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
			if topic == "" {
				return 4096
			}
			return 1_000_012
		}))
	}
	k.CreateTopic(updates, 2, configs)
	changelog := newChangelog(t, k, 2)
	group := integration.UniqueName(t, "g")
	const n = 2_000
	want := seedReports(t, k, in, n)
	bad := map[string]int{}
	failing := 0
	for i := range n {
		if i%10 == 7 || i%10 == 3 {
			bad[regionOf("in-"+strconv.Itoa(i))]++
			failing++
		}
	}
	for r, n := range bad {
		c, _ := strconv.Atoi(want[r])
		if want[r] = strconv.Itoa(c - n); c == n {
			delete(want, r) // every report of it failed: never counted
		}
	}
	count := eos.Count()
	big := make([]byte, 6000)
	rand.Read(big) // incompressible: compressed, zeros would fit
	var tooLarge atomic.Int64
	handler := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		outs, err := count(ctx, r)
		switch {
		case err != nil:
			return nil, err
		case strings.HasSuffix(string(r.Value), "7"):
			return nil, errors.New("counted, then failed")
		case strings.HasSuffix(string(r.Value), "3"):
			err := eos.StateOf(ctx).Put(append([]byte("big-"), r.Key...), big)
			if errors.Is(err, state.ErrTooLarge) {
				tooLarge.Add(1)
			}
			return nil, err
		}
		return outs, nil
	}
	p := startProcessor(t, handler, append(statefulOpts(k, group, in, changelog, updates, "0"),
		eos.OnHandlerError(eos.DeadLetter(dlt)), eos.ClientOptions(clientOpts...))...)
	waitForTotals(t, k, updates, want, 2*time.Minute)
	if err := p.stop(t); err != nil {
		t.Fatalf("stopped with %v", err)
	}
	if got := lastValues(t, k, changelog, true); !maps.Equal(got, want) {
		t.Fatalf("the changelog ends at %v, want %v", got, want)
	}
	if got := len(k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout)); got != failing || tooLarge.Load() == 0 {
		t.Fatalf("%d records dead-lettered (%d Puts failed with state.ErrTooLarge), want %d", got, tooLarge.Load(), failing)
	}
}

// A changelog that cannot hold the state is refused at Run within
// seconds, naming it: missing, another partition count, not compacted.
func TestAChangelogThatDoesNotFitIsAConfigError(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(3), k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	deleteOnly := "delete"
	notCompacted := integration.UniqueName(t, "changelog")
	k.CreateTopic(notCompacted, 3, map[string]*string{"cleanup.policy": &deleteOnly})
	for name, changelog := range map[string]string{
		"missing":       integration.UniqueName(t, "missing"),
		"partitions":    newChangelog(t, k, 2),
		"not compacted": notCompacted,
	} {
		t.Run(name, func(t *testing.T) {
			p, err := eos.NewProcessor(eos.Count(), append(statefulOpts(k, group, in, changelog, out+"-x", "0"), eos.Logger(testLogger(t)))...)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			err = p.Run(ctx)
			ce, ok := errors.AsType[*eoskit.ConfigError](err)
			if !ok || !strings.Contains(err.Error(), changelog) || time.Since(start) > 20*time.Second {
				t.Fatalf("Run: %v after %s, want a *eoskit.ConfigError naming %s within seconds", err, time.Since(start), changelog)
			}
			t.Logf("%s: %v (%s)", ce.Setting, err, time.Since(start).Round(time.Millisecond))
		})
	}
}

// Options that contradict keyed state are refused by NewProcessor.
func TestStatefulOptionsAreChecked(t *testing.T) {
	exactlyOnce := []eos.ProcessorOption{eos.Brokers("127.0.0.1:1"), eos.Group("g"), eos.TransactionalID("g-0")}
	atLeastOnce := []eos.ProcessorOption{eos.Brokers("127.0.0.1:1"), eos.Group("g"), eos.WithSemantics(eos.AtLeastOnce)}
	for _, c := range []struct {
		name string
		base []eos.ProcessorOption
		opts []eos.ProcessorOption
	}{
		{"two inputs", exactlyOnce, []eos.ProcessorOption{eos.Topics("a", "b"), eos.Changelog("c")}},
		{"changelog is the input", exactlyOnce, []eos.ProcessorOption{eos.Topics("a"), eos.Changelog("a")}},
		{"updates to the changelog", exactlyOnce, []eos.ProcessorOption{eos.Topics("a"), eos.Changelog("c", eos.EmitUpdates("c"))}},
		{"no restore time", exactlyOnce, []eos.ProcessorOption{eos.Topics("a"), eos.Changelog("c", eos.RestoreTimeout(0))}},
		// A dead owner's open transaction holds a restore for up to the
		// transaction timeout (40 s by default).
		{"restore time within the transaction timeout", exactlyOnce, []eos.ProcessorOption{eos.Topics("a"), eos.Changelog("c", eos.RestoreTimeout(30*time.Second))}},
		{"restore time without the margin past it", exactlyOnce, []eos.ProcessorOption{eos.Topics("a"), eos.Changelog("c", eos.RestoreTimeout(45*time.Second))}},
		{"at-least-once", atLeastOnce, []eos.ProcessorOption{eos.Topics("a"), eos.Changelog("c")}},
		{"updates to the input", exactlyOnce, []eos.ProcessorOption{eos.Topics("a"), eos.Changelog("c", eos.EmitUpdates("a"))}},
		{"changelog is the dead-letter topic", exactlyOnce, []eos.ProcessorOption{eos.Topics("a"), eos.Changelog("c"), eos.OnHandlerError(eos.DeadLetter("c"))}},
		{"updates to the dead-letter topic", exactlyOnce, []eos.ProcessorOption{eos.Topics("a"), eos.Changelog("c", eos.EmitUpdates("u")), eos.OnHandlerError(eos.DeadLetter("u"))}},
	} {
		_, err := eos.NewProcessor(eos.Count(), append(slices.Clone(c.base), c.opts...)...)
		if _, ok := errors.AsType[*eoskit.ConfigError](err); !ok {
			t.Errorf("%s: %v, want a *eoskit.ConfigError", c.name, err)
		}
	}
	if _, err := eos.NewProcessor(eos.Count(), append(slices.Clone(exactlyOnce), eos.Topics("a"), eos.Changelog("c"))...); err != nil {
		t.Fatalf("a stateful processor: %v", err)
	}
	// An unset RestoreTimeout follows a long transaction timeout instead
	// of refusing it.
	if _, err := eos.NewProcessor(eos.Count(), append(slices.Clone(exactlyOnce), eos.Topics("a"), eos.Changelog("c"),
		eos.ClientOptions(kgo.TransactionTimeout(10*time.Minute)))...); err != nil {
		t.Fatalf("a stateful processor with a 10-minute transaction timeout: %v", err)
	}
}

// A pebble store keeps its checkpoint across a clean stop: the next run
// restores nothing from the changelog (the memory store restores it all),
// and counts on from where it stood.
func TestPebbleStoreRestoresOnlyTheChangelogsTail(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, updates := k.NewTopic(2), k.NewTopic(2)
	changelog := newChangelog(t, k, 2)
	group := integration.UniqueName(t, "g")
	want := seedReports(t, k, in, 4_000)
	dir := t.TempDir()
	run := func(store state.Factory, until map[string]string) string {
		t.Helper()
		logs := &integration.LogBuffer{}
		p := startProcessor(t, eos.Count(), append(statefulOpts(k, group, in, changelog, updates, "0", eos.Stores(store)),
			eos.Logger(slog.New(slog.NewTextHandler(logs, nil))))...)
		waitFor(t, 2*time.Minute, "the processor to hold its partitions", func() bool { return len(p.p.State().Partitions()) == 2 })
		if until != nil {
			waitForTotals(t, k, updates, until, 2*time.Minute)
		}
		if err := p.stop(t); err != nil {
			t.Fatalf("stopped with %v", err)
		}
		return logs.String()
	}
	run(pebblestore.Factory(dir, nil), want)
	// More reports, counted by a run on the same directory.
	more := seedReports(t, k, in, 4_000) // ids in-0.., the same regions again
	for r, n := range more {
		a, _ := strconv.Atoi(want[r])
		b, _ := strconv.Atoi(n)
		want[r] = strconv.Itoa(a + b)
	}
	logs := run(pebblestore.Factory(dir, nil), want)
	if n := strings.Count(logs, "changelog restored"); n != 2 || strings.Count(logs, " records=0 ") != 2 {
		t.Fatalf("the second pebble run restored other than nothing, twice:\n%s", logs)
	}
	logs = run(state.MemoryFactory(), nil)
	if strings.Count(logs, " records=0 ") != 0 {
		t.Fatalf("a memory store restored nothing: the test cannot tell a checkpoint from none:\n%s", logs)
	}
}
