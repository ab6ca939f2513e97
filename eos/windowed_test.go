package eos_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/verify"
	"github.com/eoskit/eoskit/window"
)

// copierWindow is the windowed count the copier runs with
// EOS_COPIER_WINDOW set: per minute of report time, taking reports 20 s
// late, kept a day (nothing expires within a test).
var copierWindow = window.Spec{Size: time.Minute, Advance: time.Minute, Grace: 20 * time.Second, Retention: 24 * time.Hour}

// reportTime is the time of report id: 10 ms apart in id order, but every
// 7th 15 s behind (inside the grace period, or in an earlier window still
// open) and every 11th 90 s behind (past it, most often: late). Aborted
// reports are 50 minutes ahead (a broker refuses a record more than an
// hour ahead of its clock, message.timestamp.after.max.ms): a processor
// that saw one would move stream time there and find every later report
// late.
func reportTime(id string) time.Time {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	t := time.Now().Truncate(time.Hour).Add(-2*time.Hour + time.Duration(n)*10*time.Millisecond)
	switch {
	case strings.HasPrefix(id, "aborted-"):
		return t.Add(50 * time.Minute)
	case n%11 == 0:
		return t.Add(-90 * time.Second)
	case n%7 == 0:
		return t.Add(-15 * time.Second)
	}
	return t
}

// windowTruth is verify.CountWindows of in's committed input, as text.
func windowTruth(t *testing.T, k *integration.KafkaCluster, in string) (want map[string]string, late int, ignoringLateness, closed map[string]string) {
	t.Helper()
	wc := verify.CountWindows(k.ReadAll(in, kgo.ReadCommitted(), verifyTimeout), copierWindow.Size, copierWindow.Grace)
	text := func(m map[string]int64) map[string]string {
		out := map[string]string{}
		for k, n := range m {
			out[k] = strconv.FormatInt(n, 10)
		}
		return out
	}
	return text(wc.Counts), wc.Late, text(wc.IgnoringLateness), text(wc.Closed)
}

// The dashboard's per-minute counts by report time, with reports out of
// order and some late, are exact through: a counter SIGKILLed while its
// transaction holds changelog records, its replacement restoring each
// partition's windows and stream time from the changelog, a second
// instance joining and leaving (partitions revoked and restored
// elsewhere). Inputs from a transactional producer that also aborts (its
// aborted reports 50 minutes ahead), over four partitions. Checked from
// outside against the truth computed from the committed input: the
// updates and the changelog end at it, each window's counts only
// growing; views never hold more; each window closed at the end has its
// final count on the finals topic once (EmitFinal), and no other window. The truth has late reports and differs
// from a count that ignores lateness, so a design that lost stream time
// in a restore, or never had it, fails here.
func TestWindowedCountIsExactThroughCrashesAndRebalances(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, updates := k.NewTopic(4), k.NewTopic(4)
	changelog := newChangelog(t, k, 4)
	group := integration.UniqueName(t, "g")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, _, err := integration.SeedTransactional(ctx, k.Brokers, in, 20_000, 500, func(r *kgo.Record) {
		r.Key = []byte(regionOf(string(r.Value)))
		r.Timestamp = reportTime(string(r.Value))
	}); err != nil {
		t.Fatal(err)
	}
	want, late, ignoring, closed := windowTruth(t, k, in)
	if late == 0 || mapsEqual(want, ignoring) {
		t.Fatalf("the input has %d late reports: the test could not tell a design that ignores lateness", late)
	}
	t.Logf("%d windows, %d late reports, %d closed at the end", len(want), late, len(closed))
	finals := k.NewTopic(4)

	victim := startCopier(t, k, eos.ExactlyOnce, in, updates, group, group+"-0", "EOS_COPIER_CHANGELOG="+changelog, "EOS_COPIER_WINDOW="+finals)
	waitFor(t, 2*time.Minute, "an open transaction with changelog records", func() bool {
		hwm, lso := endOffsets(t, k.Admin, changelog)
		return hwm > lso && lso > 0
	})
	victim.kill()

	h, err := eos.WindowedCount(copierWindow, eos.EmitFinal(finals))
	if err != nil {
		t.Fatal(err)
	}
	a := startProcessor(t, h, statefulOpts(k, group, in, changelog, updates, "0")...)
	waitFor(t, 2*time.Minute, "the replacement to restore and count", func() bool { return len(a.p.State().Partitions()) > 0 })
	b := startProcessor(t, h, statefulOpts(k, group, in, changelog, updates, "1")...)
	countEndsAtTotals(t, k, a, b, want, updates, changelog)
	finalsOnce(t, k, finals, closed)
}

// finalsOnce checks the finals topic read_committed: each window closed
// at the end has its final count once, and no other window has one.
func finalsOnce(t *testing.T, k *integration.KafkaCluster, finals string, closed map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, r := range k.ReadAll(finals, kgo.ReadCommitted(), verifyTimeout) {
		if prev, twice := got[string(r.Key)]; twice {
			t.Fatalf("window %q emitted twice: %s, then %s", r.Key, prev, r.Value)
		}
		got[string(r.Key)] = string(r.Value)
	}
	if len(closed) == 0 || !mapsEqual(got, closed) {
		t.Fatalf("%d finals, want the %d windows closed at the end with their counts", len(got), len(closed))
	}
}

// The windowed count under the eager protocol (range: a join revokes
// every partition of every member, and each is restored again, windows
// and stream time), under cooperative-sticky (only what moves is
// revoked, over two rebalances) and under KIP-848's consumer protocol
// (revokes one by one, the broker assigning): a second instance joins mid-stream and
// leaves, with the same checks as the crash test above (updates and
// changelog end at the truth, views never pass it, each closed window's
// final once). Inputs from a transactional producer that also aborts,
// over four partitions, late reports among them.
func TestWindowedCountIsExactUnderEachRebalanceProtocol(t *testing.T) {
	t.Parallel()
	underEachRebalanceProtocol(t, func(t *testing.T, k *integration.KafkaCluster, name string, opt eos.ProcessorOption) {
		in, updates, finals := k.NewTopic(4), k.NewTopic(4), k.NewTopic(4)
		changelog := newChangelog(t, k, 4)
		group := integration.UniqueName(t, "windows-"+name)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		const reports = 12_000 // 120 s of report time: the first minute closes
		if _, _, err := integration.SeedTransactional(ctx, k.Brokers, in, reports, 500, func(r *kgo.Record) {
			r.Key = []byte(regionOf(string(r.Value)))
			r.Timestamp = reportTime(string(r.Value))
		}); err != nil {
			t.Fatal(err)
		}
		want, late, _, closed := windowTruth(t, k, in)
		if late == 0 || len(closed) == 0 {
			t.Fatalf("the input has %d late reports and %d windows closed: it tests neither", late, len(closed))
		}
		count, err := eos.WindowedCount(copierWindow, eos.EmitFinal(finals))
		if err != nil {
			t.Fatal(err)
		}
		var counted atomic.Int64
		paced := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			time.Sleep(300 * time.Microsecond) // so that the join lands mid-stream
			out, err := count(ctx, r)
			counted.Add(1)
			return out, err
		}
		opts := func(instance string) []eos.ProcessorOption {
			return append(statefulOpts(k, group, in, changelog, updates, instance), opt)
		}
		a := startProcessor(t, paced, opts("0")...)
		waitFor(t, 2*time.Minute, "the first instance to restore and count", func() bool { return len(a.p.State().Partitions()) > 0 })
		b := startProcessor(t, paced, opts("1")...)
		waitFor(t, 2*time.Minute, "the second instance to hold partitions", func() bool { return len(b.p.State().Partitions()) > 0 })
		if counted.Load() >= reports {
			t.Fatal("every report was counted before the second instance held a partition: no rebalance mid-stream")
		}
		countEndsAtTotals(t, k, a, b, want, updates, changelog)
		finalsOnce(t, k, finals, closed)
	})
}

// A window whose aggregate grows too large for a changelog record is the
// fault of the record that would grow it: that record's handler fails
// with state.ErrTooLarge and goes to the dead-letter topic with the
// reason, the window keeps what it had, and the processor goes on (the
// next window takes records). Without the check, the changelog record
// would fail the whole transaction at commit, and the session would
// restart on the same records until Run gave up. A real broker: the
// changelog's max.message.bytes is 4,096, each record adds 1,500 random
// bytes (incompressible), so a window holds two.
func TestAWindowTooLargeForTheChangelogIsTheRecordsFault(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, dlt := k.NewTopic(1), k.NewTopic(1)
	changelog := integration.UniqueName(t, "changelog")
	compact, small := "compact", "4096"
	k.CreateTopic(changelog, 1, map[string]*string{"cleanup.policy": &compact, "max.message.bytes": &small})
	group := integration.UniqueName(t, "big-windows")
	spec := window.Spec{Size: time.Minute, Advance: time.Minute, Retention: time.Hour} // nothing expires
	t0 := time.Now().Add(-time.Hour).Truncate(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var recs []*kgo.Record
	for i := range 6 { // five in the first minute, then one in the next
		at := t0.Add(time.Duration(i) * time.Second)
		if i == 5 {
			at = t0.Add(time.Minute)
		}
		chunk := make([]byte, 1500)
		rand.Read(chunk)
		recs = append(recs, &kgo.Record{Topic: in, Key: []byte("north"), Value: chunk, Timestamp: at})
	}
	if err := k.Client().ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	agg, err := eos.WindowedAggregate(spec, func(agg []byte, r *kgo.Record) ([]byte, error) { return append(agg, r.Value...), nil })
	if err != nil {
		t.Fatal(err)
	}
	p := startProcessor(t, agg, append(processorOpts(k, group, in, "0"),
		eos.Changelog(changelog), eos.OnHandlerError(eos.DeadLetter(dlt)))...)
	waitFor(t, time.Minute, "the input to be committed", func() bool { return groupCommitted(t, k.Admin, group, in) == int64(len(recs)) })
	if err := p.stop(t); err != nil {
		t.Fatalf("stopped with %v; want the processor to go on past the records too large", err)
	}
	dead := k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout)
	if len(dead) != 3 {
		t.Fatalf("%d records dead-lettered; want the first minute's third, fourth and fifth", len(dead))
	}
	for _, r := range dead {
		if reason := headerValue(r, loop.HeaderError); !strings.Contains(reason, state.ErrTooLarge.Error()) {
			t.Errorf("dead-lettered with the reason %q; want one naming %q", reason, state.ErrTooLarge)
		}
	}
	last := map[string][]byte{}
	for _, r := range k.ReadAll(changelog, kgo.ReadCommitted(), verifyTimeout) {
		last[string(r.Key)] = r.Value
	}
	first, next := window.AppendKey(nil, []byte("north"), t0), window.AppendKey(nil, []byte("north"), t0.Add(time.Minute))
	if got, want := last[string(first)], append(slices.Clone(recs[0].Value), recs[1].Value...); !bytes.Equal(got, want) {
		t.Fatalf("the first minute's aggregate is %d bytes; want its first two records' %d", len(got), len(want))
	}
	if got := last[string(next)]; !bytes.Equal(got, recs[5].Value) {
		t.Fatalf("the next minute's aggregate is %d bytes; want its record's %d", len(got), len(recs[5].Value))
	}
}

// headerValue returns r's header key's value, or "".
func headerValue(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
