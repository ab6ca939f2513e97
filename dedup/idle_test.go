package dedup_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/integration"
)

// Of two members of a group on a one-partition topic, the one the group
// assigns nothing says so once, about 11 s after it joined (a 6 s
// session timeout, plus 5 s), naming the likely reasons; the member that
// holds the partition says nothing of the kind. The watch is the one
// every runner shares (internal/loop), so one runner's test covers it.
func TestMemberAssignedNothingSaysSoOnce(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	b.produce(t, stamped(3)...)
	group := integration.UniqueName(t, "g")
	const line = "the group has assigned this member no partition"
	member := func(w *logWatch) *run {
		return b.runConsumer(t, b.pool, b.handler("a"), dedup.Group(group),
			dedup.Logger(slog.New(slog.NewTextHandler(w, nil))), dedup.ClientOptions(kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(6*time.Second)))
	}
	var first, second logWatch
	r1 := member(&first)
	waitFor(t, "the first member to apply the records", func() bool { r1.running(t); return r1.c.Stats().Applied == 3 })
	joined := time.Now()
	r2 := member(&second)
	deadline := joined.Add(25 * time.Second)
	for second.count(line) == 0 {
		r2.running(t)
		if time.Now().After(deadline) {
			t.Fatalf("the member assigned nothing said nothing of it within 25 s; health %+v", r2.c.Health())
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(joined)
	time.Sleep(2 * time.Second)
	if got := second.count(line); got != 1 {
		t.Errorf("the member assigned nothing said so %d times; want once", got)
	}
	if got := first.count(line); got != 0 {
		t.Errorf("the member holding the partition said %d times that it holds none", got)
	}
	if took < 11*time.Second {
		t.Errorf("said so %s after joining; want no sooner than the session timeout plus 5 s (11 s)", took)
	}
	r2.stop(t)
	r1.stop(t)
}
