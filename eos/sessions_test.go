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

// copierSessions is the session count the copier runs with
// EOS_COPIER_SESSIONS set: five seconds' gap, two of grace, kept an hour
// (nothing expires within a test).
var copierSessions = window.Sessions{Gap: 5 * time.Second, Grace: 2 * time.Second, Retention: time.Hour}

// sessionTime is the time of report id: in bursts of 2,000 reports, 5 ms
// apart (a region's every 200 ms: one session per region per burst), 30
// s from one burst's start to the next; every 7th 3 s behind (inside its
// session), every 13th 25 s behind (reaching the previous burst's
// session, closed: late). Aborted reports are 50 minutes ahead: a
// processor that saw one would close every session.
func sessionTime(id string) time.Time {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	t := time.Now().Truncate(time.Hour).Add(-2*time.Hour + time.Duration(n/2000)*30*time.Second + time.Duration(n%2000)*5*time.Millisecond)
	switch {
	case strings.HasPrefix(id, "aborted-"):
		return t.Add(50 * time.Minute)
	case n%13 == 0 && n >= 2000:
		return t.Add(-25 * time.Second)
	case n%7 == 0:
		return t.Add(-3 * time.Second)
	}
	return t
}

// The per-region session counts are exact through a counter SIGKILLed
// while its transaction holds changelog records, its replacement
// restoring each partition's sessions, their index and stream time, and
// a second instance joining and leaving. Inputs from a transactional
// producer that also aborts (its aborted reports 50 minutes ahead), over
// four partitions, with late reports. Checked from outside against
// verify.CountSessions of the committed input: the updates and the
// changelog end at every session's count, each session's counts only
// growing (a merged or extended session ends with its tombstone); each
// session closed at the end has its final once, and no other. The
// truth differs from a count that ignores lateness (asserted): a design
// that lost the sessions' index or stream time in the restore, merging
// late reports, fails here.
func TestSessionCountIsExactThroughACrash(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, updates, finals := k.NewTopic(4), k.NewTopic(4), k.NewTopic(4)
	changelog := newChangelog(t, k, 4)
	group := integration.UniqueName(t, "sessions")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, _, err := integration.SeedTransactional(ctx, k.Brokers, in, 20_000, 500, func(r *kgo.Record) {
		r.Key = []byte(regionOf(string(r.Value)))
		r.Timestamp = sessionTime(string(r.Value))
	}); err != nil {
		t.Fatal(err)
	}
	truth := verify.CountSessions(k.ReadAll(in, kgo.ReadCommitted(), verifyTimeout), copierSessions.Gap, copierSessions.Grace)
	if truth.Late == 0 || len(truth.Closed) == 0 {
		t.Fatalf("the input has %d late reports and %d sessions closed: it tests neither", truth.Late, len(truth.Closed))
	}
	text := func(m map[string]int64) map[string]string {
		out := map[string]string{}
		for k, n := range m {
			out[k] = strconv.FormatInt(n, 10)
		}
		return out
	}
	want, closed := text(truth.Counts), text(truth.Closed)
	t.Logf("%d sessions, %d closed, %d late reports", len(want), len(closed), truth.Late)

	victim := startCopier(t, k, eos.ExactlyOnce, in, updates, group, group+"-0", "EOS_COPIER_CHANGELOG="+changelog, "EOS_COPIER_SESSIONS="+finals)
	waitFor(t, 2*time.Minute, "an open transaction with changelog records", func() bool {
		hwm, lso := endOffsets(t, k.Admin, changelog)
		return hwm > lso && lso > 0
	})
	victim.kill()

	h, err := eos.SessionCount(copierSessions, eos.EmitFinal(finals))
	if err != nil {
		t.Fatal(err)
	}
	a := startProcessor(t, h, statefulOpts(k, group, in, changelog, updates, "0")...)
	waitFor(t, 2*time.Minute, "the replacement to restore and count", func() bool { return len(a.p.State().Partitions()) > 0 })
	b := startProcessor(t, h, statefulOpts(k, group, in, changelog, updates, "1")...)
	// As countEndsAtTotals, but for the views: a session's key changes as
	// it grows, so a view's session need not be one of the truth's.
	waitFor(t, 2*time.Minute, "the second instance to hold partitions", func() bool { return len(b.p.State().Partitions()) > 0 })
	if err := b.stop(t); err != nil {
		t.Fatalf("instance 1 stopped with %v", err)
	}
	waitForTotals(t, k, updates, want, 3*time.Minute)
	if err := a.stop(t); err != nil {
		t.Fatalf("instance 0 stopped with %v", err)
	}
	if got := lastValues(t, k, changelog, true); !mapsEqual(got, want) {
		t.Fatalf("the changelog ends at %d sessions, want the %d true ones", len(got), len(want))
	}
	finalsOnce(t, k, finals, closed)
}
