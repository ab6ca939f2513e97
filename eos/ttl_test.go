package eos_test

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/verify"
)

// ttlTest is the TTL the crash test counts under.
const ttlTest = 2 * time.Minute

// userOf and userTime place report id: the first half's on users 0 to
// 199, 10 ms apart; the second half's on users 100 to 299, three minutes
// later (every user of the first half idle past the TTL: 0 to 99 expire
// for good, 100 to 199 come back and count from nothing). Aborted
// reports are 55 minutes ahead: a processor that saw one would move
// stream time there and expire every user.
func userOf(id string) string {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	u := n % 200
	if n >= ttlReports/2 {
		u += 100
	}
	return "user-" + strconv.Itoa(u)
}

const ttlReports = 20_000

func userTime(id string) time.Time {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	t := time.Now().Truncate(time.Hour).Add(-2*time.Hour + time.Duration(n)*10*time.Millisecond)
	switch {
	case strings.HasPrefix(id, "aborted-"):
		return t.Add(55 * time.Minute)
	case n >= ttlReports/2:
		return t.Add(3 * time.Minute)
	}
	return t
}

// Counts under a TTL are exact through a counter SIGKILLed while its
// transaction holds changelog records, its replacement restoring the
// counts, their write times and stream time, and a second instance
// joining and leaving: the users idle past the TTL are deleted (the
// updates topic and the changelog end with their tombstones, and their
// write times are gone too), the users that came back count from nothing,
// the others count on. Inputs from a transactional producer that also
// aborts (its aborted reports 55 minutes ahead), over four partitions.
// Checked from outside against verify.CountWithTTL of the committed
// input.
func TestCountWithTTLIsExactThroughACrash(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, updates := k.NewTopic(4), k.NewTopic(4)
	changelog := newChangelog(t, k, 4)
	group := integration.UniqueName(t, "ttl")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, _, err := integration.SeedTransactional(ctx, k.Brokers, in, ttlReports, 500, func(r *kgo.Record) {
		r.Key = []byte(userOf(string(r.Value)))
		r.Timestamp = userTime(string(r.Value))
	}); err != nil {
		t.Fatal(err)
	}
	truth := verify.CountWithTTL(k.ReadAll(in, kgo.ReadCommitted(), verifyTimeout), ttlTest, ttlTest/8)
	if len(truth.Expired) != 100 || truth.Undecided != 0 || len(truth.Counts) != 200 {
		t.Fatalf("the truth has %d users expired, %d undecided and %d live; want 100, 0 and 200", len(truth.Expired), truth.Undecided, len(truth.Counts))
	}
	want := map[string]string{}
	for u, n := range truth.Counts {
		want[u] = strconv.FormatInt(n, 10)
	}

	victim := startCopier(t, k, eos.ExactlyOnce, in, updates, group, group+"-0", "EOS_COPIER_CHANGELOG="+changelog, "EOS_COPIER_TTL="+ttlTest.String())
	waitFor(t, 2*time.Minute, "an open transaction with changelog records", func() bool {
		hwm, lso := endOffsets(t, k.Admin, changelog)
		return hwm > lso && lso > 0
	})
	victim.kill()

	opts := func(instance string) []eos.ProcessorOption {
		return statefulOpts(k, group, in, changelog, updates, instance, eos.TTL(ttlTest))
	}
	a := startProcessor(t, eos.Count(), opts("0")...)
	waitFor(t, 2*time.Minute, "the replacement to restore and count", func() bool { return len(a.p.State().Partitions()) > 0 })
	b := startProcessor(t, eos.Count(), opts("1")...)
	waitFor(t, 2*time.Minute, "the second instance to hold partitions", func() bool { return len(b.p.State().Partitions()) > 0 })
	if err := b.stop(t); err != nil {
		t.Fatalf("instance 1 stopped with %v", err)
	}
	waitForTotals(t, k, updates, want, 3*time.Minute)
	if err := a.stop(t); err != nil {
		t.Fatalf("instance 0 stopped with %v", err)
	}
	if got := lastValues(t, k, changelog, false); !maps.Equal(got, want) {
		t.Fatalf("the changelog ends at %d users, want the %d live ones at their counts", len(got), len(want))
	}
	// The write times: one per live user, none for the expired ones.
	stamps := map[string]bool{}
	for _, r := range k.ReadAll(changelog, kgo.ReadCommitted(), verifyTimeout) {
		if key := string(r.Key); state.IsReserved(r.Key) && strings.Contains(key, "ttl/") {
			stamps[key] = r.Value != nil
		}
	}
	live := 0
	for key, ok := range stamps {
		if ok {
			live++
			if _, isLive := want[key[strings.Index(key, "ttl/")+len("ttl/"):]]; !isLive {
				t.Errorf("the changelog keeps the write time of %q, expired", key)
			}
		}
	}
	if live != len(want) {
		t.Fatalf("the changelog keeps %d write times, want the %d live users'", live, len(want))
	}
}
