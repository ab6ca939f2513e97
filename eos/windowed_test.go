package eos_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
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
	// Each closed window's final count once, and no other.
	got := map[string]string{}
	for _, r := range k.ReadAll(finals, kgo.ReadCommitted(), verifyTimeout) {
		if prev, twice := got[string(r.Key)]; twice {
			t.Fatalf("window %q emitted twice: %s, then %s", r.Key, prev, r.Value)
		}
		got[string(r.Key)] = string(r.Value)
	}
	if !mapsEqual(got, closed) {
		t.Fatalf("%d finals, want the %d windows closed at the end with their counts", len(got), len(closed))
	}
}
