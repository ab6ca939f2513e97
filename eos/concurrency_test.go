package eos_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eoskit/eoskit"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/verify"
)

// inFlight counts a handler's calls under way and the most seen at once.
type inFlight struct{ now, max atomic.Int64 }

func (f *inFlight) enter() {
	n := f.now.Add(1)
	for m := f.max.Load(); n > m && !f.max.CompareAndSwap(m, n); m = f.max.Load() {
	}
}

func (f *inFlight) leave() { f.now.Add(-1) }

// Handlers run at once, a lane per input partition, on input from a
// transactional producer that also aborts, over six partitions, while a
// second instance joins and the first leaves (each rebalance aborts the
// transactions in flight), with records that always fail (retried, then
// dead-lettered) and records whose handler panics once. Every good input
// is copied once, in input order per partition, nothing aborted is
// visible, every bad one is dead-lettered once, and handlers did run at
// once, never more than the bound.
func TestConcurrentHandlersKeepPartitionOrderExactlyOnce(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out, dlt := k.NewTopic(6), k.NewTopic(4), k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	inputs := k.SeedHostile(in, 6000, 100)
	var panicked sync.Map
	handler := func(f *inFlight, parts *partitionsInFlight) eos.HandlerFunc {
		return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			f.enter()
			defer f.leave()
			parts.enter(r.Partition)
			defer parts.leave(r.Partition)
			time.Sleep(time.Millisecond)
			id := string(r.Key)
			switch {
			case strings.HasSuffix(id, "777"):
				return nil, errors.New("poison record " + id)
			case strings.HasSuffix(id, "555"):
				if _, again := panicked.LoadOrStore(id, true); !again {
					panic("handler panics once on " + id)
				}
			}
			return copyHandler(out)(ctx, r)
		}
	}
	var good, bad []string
	for _, id := range inputs.Committed {
		if strings.HasSuffix(id, "777") {
			bad = append(bad, id)
		} else {
			good = append(good, id)
		}
	}
	var logs integration.LogBuffer
	opts := func(instance string) []eos.ProcessorOption {
		return append(processorOpts(k, group, in, instance), eos.Concurrency(4, eos.PartitionOrder), eos.MaxRecordsPerCommit(5000),
			eos.OnHandlerError(eoskit.Retry(time.Millisecond, 2).Then(eos.DeadLetter(dlt))),
			eos.Logger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	}
	progress := followCommitted(t, k, out)
	var fa, fb inFlight
	var pa, pb partitionsInFlight
	a := startProcessor(t, handler(&fa, &pa), opts("a")...)
	waitFor(t, 2*time.Minute, "a third of the inputs", func() bool { return progress.n.Load() >= int64(len(good)/3) })
	b := startProcessor(t, handler(&fb, &pb), opts("b")...)
	waitFor(t, 2*time.Minute, "two thirds of the inputs", func() bool { return progress.n.Load() >= int64(2*len(good)/3) })
	if err := a.stop(t); err != nil {
		t.Fatalf("processor a stopped with %v", err)
	}
	waitFor(t, 2*time.Minute, "every good input", func() bool {
		select {
		case <-b.finished:
			t.Fatalf("processor b returned %v before every good input was copied", b.err)
		default:
		}
		return progress.n.Load() >= int64(len(good))
	})
	if err := b.stop(t); err != nil {
		t.Fatalf("processor b stopped with %v", err)
	}
	rep := k.VerifyInputs(integration.Inputs{Committed: good, Aborted: inputs.Aborted}, out, verifyTimeout)
	dead := map[string]int{}
	for _, r := range k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout) {
		dead[string(r.Key)]++
	}
	for _, id := range bad {
		if dead[id] != 1 {
			t.Errorf("%s is %d times in the dead-letter topic, want once", id, dead[id])
		}
	}
	if len(dead) != len(bad) {
		t.Errorf("the dead-letter topic holds %d distinct records, want the %d that always fail", len(dead), len(bad))
	}
	if fa.max.Load() < 2 || fa.max.Load() > 4 || fb.max.Load() > 4 {
		t.Errorf("handlers at once: at most %d (a) and %d (b); want a above 1 and neither above the bound, 4", fa.max.Load(), fb.max.Load())
	}
	// From the seeded backlog, lanes fed across polls run partitions at
	// once: a poll holds one partition's buffered records.
	if most, _ := pa.read(); most < 3 {
		t.Errorf("at most %d partitions were in a's handler at once, from a backlog over 6 and a bound of 4; want at least 3", most)
	}
	mostA, _ := pa.read()
	mostB, callsB := pb.read()
	if callsB == 0 {
		t.Errorf("b handled no record: a took everything before b joined, and no handover was exercised")
	}
	// Whether b's join took partitions while a's lanes held paused ones
	// depends on timing (TestARevokeOfPausedPartitionsLosesNothing makes
	// sure of it on kfake): logged, not asserted.
	revokedPaused := strings.Count(logs.String(), "while lanes held paused ones")
	t.Logf("verifier: %v; handlers at once: a %d, b %d; partitions at once: a %d, b %d; b's calls %d; revokes while paused %d", rep, fa.max.Load(), fb.max.Load(), mostA, mostB, callsB, revokedPaused)
}

// Under KeyOrder, records of one partition with different keys run at once,
// and each key's records keep their order: a single input partition, 20
// keys, from a transactional producer that also aborts. The verifier checks
// order per key (the stream each output names); the negative control
// checks the same outputs per partition, and finds them out of order,
// which shows that keys did overtake each other.
func TestConcurrentHandlersKeepKeyOrderExactlyOnce(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(1), k.NewTopic(3)
	group := integration.UniqueName(t, "g")
	ctx := context.Background()
	var seq atomic.Int64
	committed, aborted, err := integration.SeedTransactional(ctx, k.Brokers, in, 3000, 100, func(r *kgo.Record) {
		r.Key = fmt.Appendf(nil, "k%d", seq.Add(1)%20)
	})
	if err != nil {
		t.Fatal(err)
	}
	var f inFlight
	h := func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		f.enter()
		defer f.leave()
		time.Sleep(time.Millisecond)
		// The input's id is its value; its stream, partition and key.
		return []*kgo.Record{{Topic: out, Key: r.Key, Value: fmt.Appendf(nil, "%s|%d/%s|%d", r.Value, r.Partition, r.Key, r.Offset)}}, nil
	}
	progress := followCommitted(t, k, out)
	p := startProcessor(t, h, append(processorOpts(k, group, in, "0"), eos.Concurrency(8, eos.KeyOrder))...)
	waitFor(t, 2*time.Minute, "every input", func() bool { return progress.n.Load() >= int64(len(committed)) })
	if err := p.stop(t); err != nil {
		t.Fatalf("processor stopped with %v", err)
	}
	rep := k.VerifyInputs(integration.Inputs{Committed: committed, Aborted: aborted}, out, verifyTimeout)
	if f.max.Load() < 2 || f.max.Load() > 8 {
		t.Errorf("handlers at once within one partition: at most %d, want above 1 and at most the bound, 8", f.max.Load())
	}

	outs, err := verify.DecodeOutputs(k.ReadAll(out, kgo.ReadCommitted(), verifyTimeout))
	if err != nil {
		t.Fatal(err)
	}
	for i := range outs {
		outs[i].Stream, _, _ = strings.Cut(outs[i].Stream, "/")
	}
	control := verify.Check(verify.Run{Input: committed, Output: outs})
	if control.OutOfOrder.Count == 0 {
		t.Errorf("checked per partition, the outputs are in order (%v): keys never overtook each other, so KeyOrder ran nothing at once", control)
	}
	t.Logf("verifier per key: %v; per partition (control): out-of-order=%d; handlers at once: %d", rep, control.OutOfOrder.Count, f.max.Load())
}
