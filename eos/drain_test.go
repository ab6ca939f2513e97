package eos_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// When Run's ctx ends (SIGTERM), the processor stops polling, lets the
// handler under way finish, and commits what completed: every output a
// handler returned is committed by the time Run returns. With
// DrainTimeout(0) (the negative control, and the behaviour before drain
// existed) the transaction under way is aborted instead, and its outputs
// are never committed. Either way a successor then copies the rest, each
// input once.
func TestShutdownDrainsAndCommitsWhatCompleted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		drain time.Duration
	}{{"drain", 10 * time.Second}, {"no drain", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := integration.Kafka(t)
			in, out := k.NewTopic(2), k.NewTopic(2)
			group := integration.UniqueName(t, "g")
			inputs := k.SeedHostile(in, 400, 50)
			var handled atomic.Int64
			// The stop comes from the 30th handler call: the 5th record
			// of the second transaction (25 records each), the first
			// having committed.
			mid := make(chan struct{})
			slow := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
				time.Sleep(20 * time.Millisecond) // deaf to ctx: a call that must run to its end
				if handled.Add(1) == 30 {
					close(mid)
				}
				return copyHandler(out)(ctx, r)
			}
			progress := followCommitted(t, k, out)
			opts := append(processorOpts(k, group, in, "0"), eos.MaxRecordsPerCommit(25), eos.DrainTimeout(tc.drain))
			p := startProcessor(t, slow, opts...)
			select {
			case <-mid:
			case <-time.After(time.Minute):
				t.Fatal("no 30th handler call within a minute")
			}
			start := time.Now()
			if err := p.stop(t); err != nil {
				t.Fatalf("Run returned %v, want nil on shutdown", err)
			}
			took := time.Since(start)
			committed := int64(len(k.ReadAll(out, kgo.ReadCommitted(), verifyTimeout)))
			switch {
			case tc.drain > 0 && committed != handled.Load():
				t.Fatalf("after a drained shutdown (%s) %d outputs are committed, want all %d the handlers returned", took, committed, handled.Load())
			case tc.drain == 0 && committed >= handled.Load():
				t.Fatalf("without drain %d outputs are committed of the %d the handlers returned; want the transaction under way aborted", committed, handled.Load())
			}
			t.Logf("shutdown took %s; %d outputs committed, %d returned by handlers", took, committed, handled.Load())

			successor := startProcessor(t, copyHandler(out), opts...)
			waitFor(t, 2*time.Minute, "every input", func() bool { return progress.n.Load() >= int64(len(inputs.Committed)) })
			if err := successor.stop(t); err != nil {
				t.Fatalf("successor stopped with %v", err)
			}
			k.VerifyInputs(inputs, out, verifyTimeout)
		})
	}
}

// A handler that outlives the drain: once DrainTimeout passes, its ctx is
// cancelled and the transaction aborted; Run returns nil, not before the
// timeout and not long after, and nothing of that transaction is visible.
func TestShutdownAbortsPastTheDrainTimeout(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(1), k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	k.SeedHostile(in, 20, 10)
	var started atomic.Bool
	stuck := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		started.Store(true)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	const drain = 2 * time.Second
	p := startProcessor(t, stuck, append(processorOpts(k, group, in, "0"), eos.DrainTimeout(drain))...)
	waitFor(t, time.Minute, "the handler to start", started.Load)
	start := time.Now()
	if err := p.stop(t); err != nil {
		t.Fatalf("Run returned %v, want nil on shutdown", err)
	}
	if took := time.Since(start); took < drain || took > drain+15*time.Second {
		t.Fatalf("Run returned %s after its ctx ended; want the drain timeout, %s, and not much more", took, drain)
	}
	if got := k.ReadAll(out, kgo.ReadCommitted(), verifyTimeout); len(got) != 0 {
		t.Fatalf("%d outputs visible from the aborted transaction", len(got))
	}
}

// Past the drain, the handlers' ctx is cancelled and they fail with its
// error: under DeadLetter, with lanes running at once, none of those
// records is dead-lettered (they did not fail for their own sake), the
// transaction aborts, and a successor copies every input once. (The
// processor now checks its ctx before it handles a record and before it
// commits; before, only franz-go failing the dead letters produced under
// the cancelled ctx made the transaction abort, and this test passed
// then too.)
func TestShutdownPastTheDrainDeadLettersNothing(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out, dlt := k.NewTopic(4), k.NewTopic(2), k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	inputs := k.SeedHostile(in, 400, 50)
	var started atomic.Int64
	stuck := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		started.Add(1)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	opts := append(processorOpts(k, group, in, "0"), eos.OnHandlerError(eos.DeadLetter(dlt)), eos.Concurrency(4, eos.PartitionOrder))
	p := startProcessor(t, stuck, append(opts, eos.DrainTimeout(time.Second))...)
	waitFor(t, time.Minute, "handlers to start", func() bool { return started.Load() > 0 })
	if err := p.stop(t); err != nil {
		t.Fatalf("Run returned %v, want nil on shutdown", err)
	}
	if dead := k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout); len(dead) != 0 {
		t.Fatalf("%d records dead-lettered by the shutdown, want none", len(dead))
	}
	progress := followCommitted(t, k, out)
	successor := startProcessor(t, copyHandler(out), opts...)
	waitFor(t, 2*time.Minute, "every input", func() bool { return progress.n.Load() >= int64(len(inputs.Committed)) })
	if err := successor.stop(t); err != nil {
		t.Fatalf("successor stopped with %v", err)
	}
	k.VerifyInputs(inputs, out, verifyTimeout)
}
