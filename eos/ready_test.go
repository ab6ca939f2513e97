package eos_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// A processor that joins a group still holding a member that went away
// without leaving (a static member, as after a crash) waits until the
// group has waited out that member's session timeout: all the while it is
// Healthy (running, no error) but not Ready, and it becomes Ready once the
// group assigns it its partitions.
func TestProcessorIsNotReadyUntilTheGroupAssignsIt(t *testing.T) {
	k := integration.Kafka(t)
	in, out := k.NewTopic(2), k.NewTopic(2)
	group := integration.UniqueName(t, "ready")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The member that goes away: static, so its Close sends no LeaveGroup.
	const session = 6 * time.Second
	assigned := make(chan struct{}, 1)
	gone, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(in),
		kgo.InstanceID("gone"), kgo.SessionTimeout(session), kgo.RebalanceTimeout(session),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			if len(parts) > 0 {
				select {
				case assigned <- struct{}{}:
				default:
				}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	go func() { // polls until assigned, then stops
		for ctx.Err() == nil {
			if gone.PollFetches(ctx).IsClientClosed() {
				return
			}
		}
	}()
	select {
	case <-assigned:
	case <-ctx.Done():
		t.Fatal("the static member was not assigned within a minute")
	}
	gone.Close()

	txnID, err := eos.StableTransactionalID(group, "0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := eos.NewProcessor(func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		return []*kgo.Record{{Topic: out, Value: r.Value}}, nil
	}, eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in), eos.TransactionalID(txnID))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	notReady := 0
	for {
		h := p.Health()
		if h.Ready() {
			break
		}
		if h.Healthy() {
			notReady++ // the view a Healthy-only probe got wrong
		}
		if time.Since(start) > 45*time.Second {
			t.Fatalf("not Ready within 45 s: %+v", h)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waited := time.Since(start)
	if h := p.Health(); len(h.Assigned[in]) != 2 || !h.Joined {
		t.Fatalf("Ready with %+v; want both partitions assigned", h)
	}
	// The group waited for the gone member (about its session timeout):
	// the processor was Healthy and not Ready through most of it.
	if waited < session/2 || notReady == 0 {
		t.Fatalf("Ready after %s with %d Healthy-but-not-Ready looks; want about the gone member's %s session timeout, Healthy throughout", waited, notReady, session)
	}
	t.Logf("Ready after %s (the gone member's session timeout is %s)", waited.Round(time.Millisecond), session)
}

// With InstanceID the processor is a static member: the group lists it
// under that id, keeps it after Run returns (no LeaveGroup: its
// partitions wait for it), and a restart under the same id is Ready again
// well within the session timeout.
func TestProcessorWithInstanceIDIsAStaticMember(t *testing.T) {
	k := integration.Kafka(t)
	in, out := k.NewTopic(2), k.NewTopic(2)
	group := integration.UniqueName(t, "static")
	txnID, err := eos.StableTransactionalID(group, "a")
	if err != nil {
		t.Fatal(err)
	}
	const session = 20 * time.Second
	runUntilReady := func() time.Duration {
		t.Helper()
		p, err := eos.NewProcessor(func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			return []*kgo.Record{{Topic: out, Value: r.Value}}, nil
		}, eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in), eos.TransactionalID(txnID), eos.InstanceID("a"),
			eos.ClientOptions(kgo.SessionTimeout(session)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- p.Run(ctx) }()
		for !p.Health().Ready() {
			if time.Since(start) > time.Minute {
				t.Fatalf("not Ready within a minute: %+v", p.Health())
			}
			time.Sleep(20 * time.Millisecond)
		}
		took := time.Since(start)
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		return took
	}
	runUntilReady()
	adm := kadm.NewClient(k.Client())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	described, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range described[group].Members {
		if m.InstanceID != nil {
			ids = append(ids, *m.InstanceID)
		}
	}
	if len(ids) != 1 || ids[0] != "a" {
		t.Fatalf("after Run returned the group lists static members %q, want [a] (a static member does not leave)", ids)
	}
	if took := runUntilReady(); took > session/2 {
		t.Fatalf("the restart under the same id took %s to be Ready, want well within the %s session timeout", took, session)
	}
}

// Members join an idle group one at a time, and after each join every
// member's Health lists exactly the partitions it holds, and its
// StateView exactly those: disjoint, every partition once. franz-go's
// GroupTransactSession passes a revoke to the processor only once
// between two transaction ends, and an idle member ends none: without a
// re-arm, the third join's revoke never reached the first member, which
// went on listing (and serving the state of) a partition another member
// held.
func TestAnIdleProcessorSeesEveryRevoke(t *testing.T) {
	k := integration.Kafka(t)
	const partitions = 6
	in := k.NewTopic(partitions)
	changelog := newChangelog(t, k, partitions)
	group := integration.UniqueName(t, "idle-revokes")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var members []*eos.Processor
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	defer func() {
		stop()
		wg.Wait()
	}()
	for i := range 3 {
		txnID, err := eos.StableTransactionalID(group, strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		p, err := eos.NewProcessor(eos.Count(), eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in),
			eos.TransactionalID(txnID), eos.Changelog(changelog))
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, p)
		wg.Go(func() {
			if err := p.Run(runCtx); err != nil {
				t.Errorf("member %d: Run: %v", i, err)
			}
		})
		// Each member lists what it holds, the state view too, and
		// together they hold every partition once.
		var last string
		deadline := time.Now().Add(time.Minute)
		for {
			owner := map[int32]int{}
			last = ""
			ok := true
			for j, m := range members {
				h := m.Health()
				held := slices.Sorted(slices.Values(h.Assigned[in]))
				viewed := m.State().Partitions()
				last += fmt.Sprintf(" member %d: assigned %v, state of %v, joined %v;", j, held, viewed, h.Joined)
				if !h.Joined || len(held) == 0 || !slices.Equal(held, viewed) {
					ok = false
				}
				for _, p := range held {
					if prev, dup := owner[p]; dup {
						last += fmt.Sprintf(" partition %d listed by members %d and %d;", p, prev, j)
						ok = false
					}
					owner[p] = j
				}
			}
			if ok && len(owner) == partitions {
				t.Logf("after member %d joined:%s", i, last)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a minute after member %d joined, the members' views still disagree with the group:%s", i, last)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
