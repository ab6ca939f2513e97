package eos_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eoskit/eoskit/eos"
)

// An owner's lookup waits for the group's description no longer than its
// caller's ctx: with DescribeGroups answered 3 s late (brokers slow or
// out of reach), PartitionOwner with a 300 ms ctx returns within a
// second, an ErrOwnerUnknown wrapping the ctx's end, and so does a second
// caller meanwhile, while one description runs for both; once it is
// answered, a lookup names the owner. Before, every lookup waited out
// the description (up to 5 s) under one lock, and this test failed so.
func TestAnOwnerLookupWaitsNoLongerThanItsCaller(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "reports"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	start := func(name string) (*eos.Processor, chan error) {
		p, err := eos.NewProcessor(eos.Count(), eos.Brokers(brokers...), eos.Group("owners"), eos.Topics("reports"), eos.TransactionalID("owners-"+name),
			eos.CommitInterval(20*time.Millisecond), eos.Logger(testLogger(t)), eos.Endpoint("http://"+name+".example:8080"),
			eos.Changelog("owners-changelog", eos.CreateChangelog()))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		return p, done
	}
	a, doneA := start("a")
	b, doneB := start("b")
	waitFor(t, 30*time.Second, "the two to split the partitions", func() bool {
		return len(a.State().Partitions()) == 1 && len(b.State().Partitions()) == 1
	})
	theirs := b.State().Partitions()[0]
	if o, err := a.State().PartitionOwner(ctx, theirs); err != nil || o.Endpoint != "http://b.example:8080" {
		t.Fatalf("before: %+v, %v", o, err)
	}
	var described atomic.Int64
	cluster.ControlKey(int16(kmsg.DescribeGroups), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		described.Add(1)
		cluster.SleepControl(func() { time.Sleep(3 * time.Second) })
		return nil, nil, false
	})
	time.Sleep(1200 * time.Millisecond) // the last description grows old
	type lookup struct {
		err  error
		took time.Duration
	}
	lookups := make(chan lookup, 2)
	for range 2 {
		go func() {
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			began := time.Now()
			_, err := a.State().PartitionOwner(short, theirs)
			lookups <- lookup{err, time.Since(began)}
		}()
	}
	for i := range 2 {
		l := <-lookups
		if !errors.Is(l.err, eos.ErrOwnerUnknown) || !errors.Is(l.err, context.DeadlineExceeded) {
			t.Fatalf("lookup %d over a slow description: %v, want ErrOwnerUnknown and the deadline", i, l.err)
		}
		if l.took > 1500*time.Millisecond {
			t.Fatalf("lookup %d, with 300 ms, took %s over a description 3 s late", i, l.took)
		}
	}
	waitFor(t, 10*time.Second, "a lookup to name the owner once the description came", func() bool {
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		o, err := a.State().PartitionOwner(short, theirs)
		return err == nil && o.Endpoint == "http://b.example:8080"
	})
	if n := described.Load(); n < 1 || n > 4 {
		t.Errorf("%d descriptions for the lookups, want one at a time (1 to 4 in 13 s, each 3 s late)", n)
	}
	cancel()
	for _, done := range []chan error{doneA, doneB} {
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}
}
