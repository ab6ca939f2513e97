package dedup_test

import (
	"testing"
	"time"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/integration"
)

// Under Kafka's consumer group protocol (KIP-848, dedup.ConsumerProtocol)
// on Kafka 4.4: three consumers apply 6,000 messages, and their copies,
// while one leaves mid-stream, another joins and a second leaves; the
// group is a consumer group (franz-go would fall back to the classic
// protocol silently), and each message's effect is applied once.
func TestEachMessageOnceUnderTheConsumerProtocol(t *testing.T) {
	t.Parallel()
	b := newBed(t, 6)
	group := integration.UniqueName(t, "kip848")
	const n = 6000
	msgs := stamped(n)
	b.produce(t, msgs...)
	b.produce(t, copies(msgs)...)
	start := func(name string) *run {
		return b.start(t, name, dedup.Group(group), dedup.ConsumerProtocol(), dedup.MaxRecordsPerCommit(50))
	}
	runs := map[string]*run{"a": start("a"), "b": start("b"), "c": start("c")}
	waitFor(t, "the group to be a consumer-protocol group with members", func() bool {
		described, err := b.k.Admin.DescribeConsumerGroups(t.Context(), group)
		return err == nil && described[group].Err == nil && len(described[group].Members) > 0
	})
	for _, step := range []struct {
		at          int
		leave, join string
	}{{n / 4, "b", "d"}, {n / 2, "a", ""}} {
		waitFor(t, "the next milestone", func() bool { return b.effects(t) >= step.at })
		runs[step.leave].stop(t)
		if b.effects(t) >= n {
			t.Fatalf("%s left after every record was done: no churn mid-stream", step.leave)
		}
		delete(runs, step.leave)
		if step.join != "" {
			runs[step.join] = start(step.join)
		}
	}
	waitFor(t, "every message applied", func() bool { return b.effects(t) >= n })
	time.Sleep(2 * time.Second) // a copy applied twice would land by now
	for _, r := range runs {
		r.stop(t)
	}
	b.assertOnce(t, n)
}
