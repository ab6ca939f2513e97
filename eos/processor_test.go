package eos_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/testbed"
	"github.com/eoskit/eoskit/verify"
)

const verifyTimeout = 2 * time.Minute

func processorOpts(k *integration.KafkaCluster, group, in, instance string) []eos.ProcessorOption {
	txnID, err := eos.StableTransactionalID(group, instance)
	if err != nil {
		panic(err)
	}
	return []eos.ProcessorOption{
		eos.Brokers(k.Brokers...),
		eos.Group(group),
		eos.Topics(in),
		eos.TransactionalID(txnID),
	}
}

// 100,000 records through three processors while instances leave and join.
// Each join comes while every running instance is held in a handler,
// inside its open transaction: the partitions the join takes are revoked
// mid-transaction, and that transaction must abort ("rebalance") rather
// than commit. The output must still hold every input exactly once, in
// input order per partition. The test fails unless each leave and join
// happened with inputs still uncommitted, and each join revoked
// partitions of a held instance and aborted a transaction for it.
func TestProcessorExactlyOnceThroughRebalances(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	const partitions = 6
	in, out := k.NewTopic(partitions), k.NewTopic(4)
	group := integration.UniqueName(t, "g")
	const n = 100_000
	inputs := k.Seed(in, n)
	progress := followCommitted(t, k, out)

	gate := &handlerGate{}
	type member struct {
		run     *running
		metrics *countingMetrics
	}
	var all []*countingMetrics // of every instance started, stopped ones too
	start := func(instance string) member {
		m := &countingMetrics{}
		all = append(all, m)
		copyTo := copyHandler(out)
		h := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			if err := gate.pass(ctx, instance); err != nil {
				return nil, err
			}
			// Paced: unpaced, the copy ends before the first churn
			// (its milestone is read from the output, behind the copy).
			time.Sleep(200 * time.Microsecond)
			return copyTo(ctx, r)
		}
		// Handlers are held inside their transactions while the test
		// waits for members to join: a transaction timeout of minutes
		// keeps a loaded machine from turning the rebalance's abort into
		// a budget's.
		return member{startProcessor(t, h, append(processorOpts(k, group, in, instance), eos.WithMetrics(m),
			eos.ClientOptions(kgo.TransactionTimeout(3*time.Minute)))...), m}
	}
	sum := func(ms []*countingMetrics, f func(*countingMetrics) int64) (total int64) {
		for _, m := range ms {
			total += f(m)
		}
		return total
	}
	rebalanceAborts := func(m *countingMetrics) int64 { return int64(m.abortsFor("rebalance")) }
	revokes := func(m *countingMetrics) int64 { return m.rebalances.Load() }
	procs := map[string]member{"a": start("a"), "b": start("b"), "c": start("c")}

	// Rounds of churn: at each milestone one instance leaves (a clean
	// shutdown) and another joins, each a rebalance mid-stream.
	churn := []struct {
		at          int64
		leave, join string
	}{{n / 5, "b", "d"}, {2 * n / 5, "a", "b"}, {3 * n / 5, "d", "e"}}
	var leaves, joins int
	for i, c := range churn {
		waitFor(t, 3*time.Minute, "output to pass the next milestone", func() bool { return progress.n.Load() >= c.at })
		if err := procs[c.leave].run.stop(t); err != nil {
			t.Fatalf("instance %s stopped with %v, want nil on a clean shutdown", c.leave, err)
		}
		delete(procs, c.leave)
		// The group's committed offsets only grow: below n now, below n
		// when the leave happened.
		if done := groupCommitted(t, k.Admin, group, in); done >= n {
			t.Fatalf("round %d: %s left after every input was committed (%d): no churn mid-stream", i, c.leave, done)
		}
		leaves++
		// The leaver's partitions go to the others first, in a rebalance
		// the group ends before the join: a join during it would take
		// them, free, and revoke nothing.
		var desc string
		waitForWhat(t, time.Minute, func() string {
			return "the group to settle on the remaining instances, owning every partition: " + desc
		}, func() bool {
			var views []eoskit.Health
			for _, p := range procs {
				views = append(views, p.run.p.Health())
			}
			settled, d, err := testbed.GroupSettled(context.Background(), k.Admin, group, in, partitions, views...)
			if err != nil {
				t.Fatal(err)
			}
			desc = d
			return settled
		})

		// Hold every remaining instance inside a transaction, then join.
		// An instance whose partitions are all committed to their ends
		// has nothing left to be held in (progress per partition is
		// uneven: one poll holds one partition's records): it is let be.
		gate.shut()
		held := make([]*countingMetrics, 0, len(procs))
		for name, p := range procs {
			waitForWhat(t, time.Minute, func() string {
				views := map[string]eoskit.Health{}
				for n, p := range procs {
					views[n] = p.run.p.Health()
				}
				return "instance " + name + " to be held in a handler, mid-transaction, or to have nothing left: " + describeGroup(t, k.Admin, group, in, views)
			}, func() bool {
				return gate.isHolding(name) || drained(t, k.Admin, group, in, p.run.p.Health().Assigned[in])
			})
			if gate.isHolding(name) {
				held = append(held, p.metrics)
			}
		}
		if len(held) == 0 {
			t.Fatalf("round %d: no instance had inputs left to be held in: no churn mid-stream", i)
		}
		revokedBefore, abortedBefore := sum(held, revokes), sum(all, rebalanceAborts)
		procs[c.join] = start(c.join)
		waitFor(t, time.Minute, "the join to revoke partitions of a held instance", func() bool { return sum(held, revokes) > revokedBefore })
		// Nothing of the held instances commits while they are held.
		done := groupCommitted(t, k.Admin, group, in)
		if done >= n {
			t.Fatalf("round %d: %s joined after every input was committed (%d)", i, c.join, done)
		}
		joins++
		gate.open()
		waitFor(t, time.Minute, "the revoked transaction to abort for the rebalance", func() bool { return sum(all, rebalanceAborts) > abortedBefore })
		t.Logf("round %d: %s left and %s joined with %d of %d inputs committed; transactions aborted for rebalances so far: %d",
			i, c.leave, c.join, done, n, sum(all, rebalanceAborts))
	}
	waitFor(t, 3*time.Minute, "every input to be copied", func() bool { return progress.n.Load() >= n })
	for name, p := range procs {
		if err := p.run.stop(t); err != nil {
			t.Fatalf("instance %s stopped with %v", name, err)
		}
	}
	rep := k.VerifyTopic(inputs, out, verifyTimeout)
	if leaves != len(churn) || joins != len(churn) {
		t.Fatalf("%d leaves and %d joins mid-stream, want %d of each", leaves, joins, len(churn))
	}
	if got := sum(all, rebalanceAborts); got < int64(len(churn)) {
		t.Fatalf("%d transactions aborted for rebalances, want at least %d (one per join)", got, len(churn))
	}
	t.Logf("verifier: %v; leaves %d, joins %d; partitions revoked: %d times; transactions aborted for rebalances: %d",
		rep, leaves, joins, sum(all, revokes), sum(all, rebalanceAborts))
}

// drained reports whether the group committed each of partitions of in
// to the partition's end.
func drained(t testing.TB, adm *kadm.Client, group, in string, partitions []int32) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return false
	}
	ends, err := adm.ListEndOffsets(ctx, in)
	if err != nil {
		return false
	}
	for _, p := range partitions {
		c, ok := committed.Lookup(in, p)
		end, found := ends.Lookup(in, p)
		if !ok || !found || c.Err != nil || end.Err != nil || c.At < end.Offset {
			return false
		}
	}
	return true
}

// describeGroup tells, for a stall's message, each instance's view of its
// partitions and the group's committed offsets against the input's ends.
func describeGroup(t testing.TB, adm *kadm.Client, group, in string, views map[string]eoskit.Health) string {
	t.Helper()
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(views)) {
		h := views[name]
		fmt.Fprintf(&b, "instance %s: assigned %v, restoring %v, lag %v, last records %s, last commit %s, last error %q; ",
			name, h.Assigned, h.Restoring, h.Lag, h.LastRecords.Format(time.TimeOnly), h.LastCommit.Format(time.TimeOnly), h.LastError)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return b.String() + "committed offsets: " + err.Error()
	}
	ends, err := adm.ListEndOffsets(ctx, in)
	if err != nil {
		return b.String() + "end offsets: " + err.Error()
	}
	ends.Each(func(o kadm.ListedOffset) {
		at := int64(-1)
		if c, ok := committed.Lookup(in, o.Partition); ok {
			at = c.At
		}
		fmt.Fprintf(&b, "partition %d: committed %d of %d; ", o.Partition, at, o.Offset)
	})
	return b.String()
}

// handlerGate holds the handler calls that come while it is shut, until it
// opens (or the call's ctx ends), and tells which instances it holds.
type handlerGate struct {
	mu      sync.Mutex
	closed  chan struct{} // nil while open
	holding map[string]int
}

func (g *handlerGate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *handlerGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// pass returns at once while the gate is open; while it is shut, once it
// opens, or with ctx's error.
func (g *handlerGate) pass(ctx context.Context, instance string) error {
	g.mu.Lock()
	closed := g.closed
	if closed != nil {
		if g.holding == nil {
			g.holding = map[string]int{}
		}
		g.holding[instance]++
	}
	g.mu.Unlock()
	if closed == nil {
		return nil
	}
	defer func() {
		g.mu.Lock()
		g.holding[instance]--
		g.mu.Unlock()
	}()
	select {
	case <-closed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isHolding reports whether a handler call of instance is held now.
func (g *handlerGate) isHolding(instance string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.holding[instance] > 0
}

// countingMetrics counts what tests assert on.
type countingMetrics struct {
	eoskit.NopMetrics
	committed, rebalances, fenced, hanging atomic.Int64
	aborted                                *atomic.Int64
	mu                                     sync.Mutex
	reasons                                []string
}

func (m *countingMetrics) Committed(int, int, time.Duration) { m.committed.Add(1) }
func (m *countingMetrics) Aborted(reason string, _ time.Duration) {
	if m.aborted != nil {
		m.aborted.Add(1)
	}
	m.mu.Lock()
	m.reasons = append(m.reasons, reason)
	m.mu.Unlock()
}
func (m *countingMetrics) Rebalanced()               { m.rebalances.Add(1) }
func (m *countingMetrics) HangingTransaction(string) { m.hanging.Add(1) }
func (m *countingMetrics) Fenced()                   { m.fenced.Add(1) }

// abortsFor counts the transactions aborted for reason.
func (m *countingMetrics) abortsFor(reason string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, r := range m.reasons {
		if r == reason {
			n++
		}
	}
	return n
}

func (m *countingMetrics) abortReasons() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.reasons, ",")
}

// A copier process is SIGKILLed while its transaction holds output records;
// its replacement (same transactional id, as a restarted instance has) must
// finish the job with nothing lost, nothing doubled, and the killed
// transaction's records invisible.
func TestProcessorCrashMidTransactionLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(3), k.NewTopic(3)
	group := integration.UniqueName(t, "g")
	txnID := group + "-0"
	const n = 20_000
	inputs := k.Seed(in, n)

	victim := startCopier(t, k, eos.ExactlyOnce, in, out, group, txnID)
	// Wait until the victim has output records in an open transaction
	// (written, not yet committed), then kill it there.
	waitFor(t, 2*time.Minute, "an open transaction with output records", func() bool {
		hwm, lso := endOffsets(t, k.Admin, out)
		return hwm > lso && hwm > 1000
	})
	victim.kill()
	hwm, lso := endOffsets(t, k.Admin, out)
	t.Logf("killed the copier with %d output records written and the last stable offsets at %d", hwm, lso)

	progress := followCommitted(t, k, out)
	replacement := startProcessor(t, copyHandler(out), processorOpts(k, group, in, "0")...)
	waitFor(t, 3*time.Minute, "the replacement to copy every input", func() bool { return progress.n.Load() >= n })
	if err := replacement.stop(t); err != nil {
		t.Fatalf("replacement stopped with %v", err)
	}
	rep := k.VerifyTopic(inputs, out, verifyTimeout)
	aborted := verify.AbortedPositions(k.ReadRaw(out, verifyTimeout))
	if len(aborted) == 0 {
		t.Fatal("the killed transaction left no aborted records: the kill did not land mid-transaction")
	}
	t.Logf("verifier: %v; records of the killed transaction aborted: %d", rep, len(aborted))
}

// The same kill against the at-least-once loop duplicates records: the proof
// that the fault bites a weaker design, and so that the exactly-once test
// above tests something.
func TestAtLeastOnceCrashBetweenProduceAndCommitDuplicates(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(3), k.NewTopic(3)
	group := integration.UniqueName(t, "g")
	const n = 20_000
	inputs := k.Seed(in, n)

	victim := startCopier(t, k, eos.AtLeastOnce, in, out, group, "")
	waitFor(t, 2*time.Minute, "outputs written for inputs whose offsets are not committed", func() bool {
		hwm, _ := endOffsets(t, k.Admin, out)
		return hwm > 1000 && hwm > groupCommitted(t, k.Admin, group, in)+500
	})
	victim.kill()

	opts := []eos.ProcessorOption{eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in), eos.WithSemantics(eos.AtLeastOnce)}
	replacement := startProcessor(t, copyHandler(out), opts...)
	// Done when every input's offset is committed, not when the output
	// holds n records: the duplicates count there too, and stopping then
	// cut the replacement's last batch short (a flake of this test).
	waitFor(t, 3*time.Minute, "the replacement to commit every input", func() bool { return groupCommitted(t, k.Admin, group, in) >= n })
	if err := replacement.stop(t); err != nil {
		t.Fatalf("replacement stopped with %v", err)
	}
	rep := k.CheckTopic(inputs, out, verifyTimeout)
	if rep.Lost.Count != 0 {
		t.Fatalf("at-least-once lost records: %v", rep)
	}
	if rep.Duplicated.Count == 0 {
		t.Fatalf("at-least-once showed no duplicate after a crash between produce and commit: %v", rep)
	}
	t.Logf("verifier (duplicates expected): %v", rep)
}

// A processor stalls in its handler past its session timeout; a replacement
// with the same transactional id starts meanwhile. When the stalled one
// wakes, it must find itself fenced and stop with ErrFenced, and the output
// must be exactly once. Held past its transaction timeout too (30 s, the
// tests' kgo.TransactionTimeout), the zombie's epoch error also reads like
// the broker's timeout abort: a zombie that restarted on it would register
// the id again and fence its healthy successor.
func TestProcessorZombieIsFenced(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		stall time.Duration
		opts  []eos.ProcessorOption
	}{
		"past its session timeout":     {7 * time.Second, nil},  // the tests' session timeout is 6 s
		"past its transaction timeout": {31 * time.Second, nil}, // and their transaction timeout 30 s
		// The test brokers' consumer-protocol session timeout is 6 s too.
		"past its session timeout, under the consumer protocol": {7 * time.Second, []eos.ProcessorOption{eos.ConsumerProtocol()}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			zombieIsFenced(t, tc.stall, tc.opts...)
		})
	}
}

func zombieIsFenced(t *testing.T, stall time.Duration, extra ...eos.ProcessorOption) {
	k := integration.Kafka(t)
	if len(extra) > 0 {
		consumerProtocolServed(t, k)
	}
	in, out := k.NewTopic(2), k.NewTopic(2)
	group := integration.UniqueName(t, "g")
	const n = 5_000
	inputs := k.Seed(in, n)

	stalled := make(chan struct{})
	wake := make(chan struct{})
	var once sync.Once
	zombieHandler := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if r.Offset == 100 {
			once.Do(func() { close(stalled) })
			<-wake
		}
		return copyHandler(out)(ctx, r)
	}
	zombieMetrics := &countingMetrics{}
	zombie := startProcessor(t, zombieHandler, append(append(processorOpts(k, group, in, "0"), eos.WithMetrics(zombieMetrics)), extra...)...)
	select {
	case <-stalled:
	case <-time.After(2 * time.Minute):
		t.Fatal("the zombie never reached its stall")
	}
	stalledAt := time.Now()
	time.Sleep(7 * time.Second) // past the 6 s session timeout

	progress := followCommitted(t, k, out)
	replacement := startProcessor(t, copyHandler(out), append(processorOpts(k, group, in, "0"), extra...)...)
	// Let the replacement commit work before the zombie wakes, so that the
	// zombie's late commit would duplicate it if it went through.
	waitFor(t, 2*time.Minute, "the replacement to commit output", func() bool { return progress.n.Load() > 0 })
	time.Sleep(time.Until(stalledAt.Add(stall)))
	close(wake)

	if err := zombie.wait(t, 2*time.Minute); !errors.Is(err, eos.ErrFenced) {
		t.Fatalf("zombie returned %v, want ErrFenced", err)
	}
	if zombieMetrics.fenced.Load() != 1 {
		t.Fatalf("zombie reported %d fencings, want 1", zombieMetrics.fenced.Load())
	}
	waitFor(t, 3*time.Minute, "the replacement to copy every input", func() bool { return progress.n.Load() >= n })
	if err := replacement.stop(t); err != nil {
		t.Fatalf("replacement stopped with %v", err)
	}
	t.Logf("verifier: %v", k.VerifyTopic(inputs, out, verifyTimeout))
}

func failingOn(out string, fails func(r *kgo.Record) bool) eos.HandlerFunc {
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if fails(r) {
			return nil, errors.New("poison record " + string(r.Key))
		}
		return copyHandler(out)(ctx, r)
	}
}

// A handler that fails a few times is retried, its transaction aborted each
// time, and each input still lands once.
func TestProcessorRetryPolicyAbortsAndRedelivers(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(2), k.NewTopic(2)
	group := integration.UniqueName(t, "g")
	const n = 2_000
	inputs := k.Seed(in, n)

	var failures atomic.Int64
	h := failingOn(out, func(r *kgo.Record) bool {
		return string(r.Key) == "in-1234" && failures.Add(1) <= 3
	})
	metrics := &countingMetrics{}
	progress := followCommitted(t, k, out)
	p := startProcessor(t, h, append(processorOpts(k, group, in, "0"),
		eos.OnHandlerError(eoskit.Retry(50*time.Millisecond, 5)), eos.WithMetrics(metrics))...)
	waitFor(t, 2*time.Minute, "every input to be copied", func() bool { return progress.n.Load() >= n })
	if err := p.stop(t); err != nil {
		t.Fatalf("processor stopped with %v", err)
	}
	k.VerifyTopic(inputs, out, verifyTimeout)
	if got := strings.Count(metrics.abortReasons(), "handler-error"); got != 3 {
		t.Fatalf("aborted %d transactions for handler errors (%s), want 3", got, metrics.abortReasons())
	}
}

// Retry with a number of attempts, then a fallback: a record that keeps
// failing is tried that many times and then dead-lettered (in the
// transaction that commits its offset) or stops the processor naming it and
// its attempts; a record that fails fewer times lands once as output. The
// inputs come from a transactional producer that also aborts, over three
// partitions.
func TestProcessorRetryThenFallback(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)

	t.Run("dead letter", func(t *testing.T) {
		t.Parallel()
		in, out, dlt := k.NewTopic(3), k.NewTopic(3), k.NewTopic(1)
		group := integration.UniqueName(t, "g")
		inputs := k.SeedHostile(in, 600, 50)
		var mu sync.Mutex
		calls := map[string]int{}
		h := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			id := string(r.Key)
			mu.Lock()
			calls[id]++
			n := calls[id]
			mu.Unlock()
			switch {
			case strings.HasSuffix(id, "77"): // always fails
				return nil, errors.New("poison record " + id)
			case strings.HasSuffix(id, "5") && n <= 2: // fails twice, then succeeds
				return nil, errors.New("flaky record " + id)
			}
			return copyHandler(out)(ctx, r)
		}
		var good, bad []string
		for _, id := range inputs.Committed {
			if strings.HasSuffix(id, "77") {
				bad = append(bad, id)
			} else {
				good = append(good, id)
			}
		}
		progress := followCommitted(t, k, out)
		p := startProcessor(t, h, append(processorOpts(k, group, in, "0"),
			eos.OnHandlerError(eoskit.Retry(time.Millisecond, 3).Then(eos.DeadLetter(dlt))))...)
		waitFor(t, 2*time.Minute, "every good input to be copied", func() bool {
			select {
			case <-p.finished:
				t.Fatalf("Run returned %v before every good input was copied", p.err)
			default:
			}
			return progress.n.Load() >= int64(len(good))
		})
		if err := p.stop(t); err != nil {
			t.Fatalf("processor stopped with %v", err)
		}
		k.VerifyInputs(integration.Inputs{Committed: good, Aborted: inputs.Aborted}, out, verifyTimeout)
		dead := map[string]int{}
		for _, r := range k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout) {
			dead[string(r.Key)]++
		}
		mu.Lock()
		defer mu.Unlock()
		for _, id := range bad {
			if dead[id] != 1 {
				t.Errorf("%s is %d times in the dead-letter topic, want once", id, dead[id])
			}
			if calls[id] != 3 {
				t.Errorf("the handler ran %d times on %s, want 3 (the Retry's attempts), then the dead letter", calls[id], id)
			}
		}
		if len(dead) != len(bad) {
			t.Errorf("the dead-letter topic holds %d distinct records, want the %d that always fail", len(dead), len(bad))
		}
	})

	t.Run("stop", func(t *testing.T) {
		t.Parallel()
		in, out := k.NewTopic(3), k.NewTopic(3)
		group := integration.UniqueName(t, "g")
		k.SeedHostile(in, 300, 50)
		var tries atomic.Int64
		p := startProcessor(t, failingOn(out, func(r *kgo.Record) bool {
			return string(r.Key) == "in-123" && tries.Add(1) > 0
		}), append(processorOpts(k, group, in, "0"), eos.OnHandlerError(eoskit.Retry(time.Millisecond, 4)))...)
		err := p.wait(t, 2*time.Minute)
		var rerr *eoskit.RecordError
		if !errors.As(err, &rerr) || rerr.Topic != in || rerr.Attempts != 4 || !strings.Contains(err.Error(), "poison record in-123") {
			t.Fatalf("Run returned %v, want a *RecordError for in-123 after 4 attempts", err)
		}
		if got := tries.Load(); got != 4 {
			t.Fatalf("the handler ran %d times on in-123, want 4", got)
		}
	})
}

// Poison records go to the dead-letter topic in the transaction that commits
// their offsets: every input is then in exactly one of the two topics, once.
func TestProcessorDeadLetterPolicyIsAtomic(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out, dlt := k.NewTopic(2), k.NewTopic(2), k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	const n = 3_000
	inputs := k.Seed(in, n)
	poison := func(r *kgo.Record) bool { return strings.HasSuffix(string(r.Key), "7") }

	progress := followCommitted(t, k, out)
	p := startProcessor(t, failingOn(out, poison), append(processorOpts(k, group, in, "0"),
		eos.OnHandlerError(eos.DeadLetter(dlt)))...)
	var good, bad []string
	for _, id := range inputs {
		if strings.HasSuffix(id, "7") {
			bad = append(bad, id)
		} else {
			good = append(good, id)
		}
	}
	waitFor(t, 2*time.Minute, "every good input to be copied", func() bool { return progress.n.Load() >= int64(len(good)) })
	if err := p.stop(t); err != nil {
		t.Fatalf("processor stopped with %v", err)
	}
	k.VerifyTopic(good, out, verifyTimeout)

	dead := k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout)
	got := map[string]int{}
	for _, r := range dead {
		got[string(r.Key)]++
		headers := map[string]string{}
		for _, h := range r.Headers {
			headers[h.Key] = string(h.Value)
		}
		if headers["eoskit-source-topic"] != in || headers["eoskit-source-offset"] == "" || !strings.Contains(headers["eoskit-error"], "poison") {
			t.Fatalf("dead letter %s has headers %v", r.Key, headers)
		}
	}
	if len(dead) != len(bad) || len(got) != len(bad) {
		t.Fatalf("dead-letter topic holds %d records (%d distinct), want each of the %d poison records once", len(dead), len(got), len(bad))
	}
}

// Under Stop, the processor aborts and names the record; nothing of the
// failed transaction is visible, and a fixed processor resumes from the
// failed record without losing anything.
func TestProcessorStopPolicyNamesTheRecordAndLosesNothing(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(1), k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	const n = 1_000
	inputs := k.Seed(in, n)

	p := startProcessor(t, failingOn(out, func(r *kgo.Record) bool { return r.Offset == 500 }), processorOpts(k, group, in, "0")...)
	err := p.wait(t, 2*time.Minute)
	var herr *eoskit.RecordError
	if !errors.As(err, &herr) || herr.Topic != in || herr.Partition != 0 || herr.Offset != 500 {
		t.Fatalf("Run returned %v, want a *RecordError for %s[0]@500", err, in)
	}
	before := k.ReadAll(out, kgo.ReadCommitted(), verifyTimeout)
	if len(before) >= 500 {
		t.Fatalf("%d outputs visible after stopping at offset 500; the failed transaction leaked", len(before))
	}

	progress := followCommitted(t, k, out)
	fixed := startProcessor(t, copyHandler(out), processorOpts(k, group, in, "0")...)
	waitFor(t, 2*time.Minute, "the fixed processor to copy the rest", func() bool { return progress.n.Load() >= n })
	if err := fixed.stop(t); err != nil {
		t.Fatalf("fixed processor stopped with %v", err)
	}
	k.VerifyTopic(inputs, out, verifyTimeout)
}

func TestProcessorRunTwiceAtOnceIsRefused(t *testing.T) {
	t.Parallel()
	p, err := eos.NewProcessor(copyHandler("out"), eos.Brokers("127.0.0.1:1"), eos.Group("g"), eos.Topics("in"), eos.TransactionalID("g-0"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	time.Sleep(100 * time.Millisecond)
	second, cancelSecond := context.WithTimeout(context.Background(), 30*time.Second) // were it the first to run
	defer cancelSecond()
	if err := p.Run(second); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("second Run returned %v, want an already-running error", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("first Run returned %v after cancel, want nil", err)
	}
}

// The broker is killed with SIGKILL while processors copy, stays down for
// 35 s (a coordinator gone longer than an end is retried), and is started
// on the same data: transactions in flight are lost with it or aborted,
// the processors ride the outage out (Run never returns) and reconnect,
// and the output is still exactly once.
func TestProcessorSurvivesBrokerHardRestart(t *testing.T) {
	t.Parallel()
	b := testbed.StartLocalBroker(t)
	k := b.KafkaCluster
	in, out := k.NewTopic(3), k.NewTopic(3)
	group := integration.UniqueName(t, "g")
	// From a transactional producer that also aborts.
	inputs := k.SeedHostile(in, 15_000, 500)
	n := int64(len(inputs.Committed))
	progress := followCommitted(t, k, out)

	slow := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		time.Sleep(100 * time.Microsecond)
		return copyHandler(out)(ctx, r)
	}
	// A single broker's restart leaves partitions leaderless while markers
	// are written, and Kafka 4.1-4.4 then drops them (KAFKA-20734): on one
	// such broker the processors must repair what that leaves hanging.
	// Kafka 3.x has no such bug (and no transaction protocol v2, which
	// the repair needs): there the default, detect and stop, must do.
	opts := func(instance string) []eos.ProcessorOption {
		o := processorOpts(k, group, in, instance)
		if testbed.TransactionVersion(t, k) >= 2 {
			o = append(o, eos.OnHangingTransaction(eos.RepairHangingTransactions()))
		}
		return o
	}
	procs := []*running{
		startProcessor(t, slow, opts("0")...),
		startProcessor(t, slow, opts("1")...),
	}
	waitFor(t, 2*time.Minute, "30% of the output", func() bool { return progress.n.Load() >= n*3/10 })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	atKill := progress.n.Load()
	if err := b.Outage(ctx, testbed.LongOutage); err != nil {
		t.Fatalf("outage: %v (broker log: %s)", err, b.Log())
	}
	if atKill >= n {
		t.Fatalf("the copy had finished (%d outputs) before the broker was killed: the fault did not land mid-run", atKill)
	}
	t.Logf("broker killed, down %s and started again, with %d of %d outputs committed", testbed.LongOutage, atKill, n)
	waitFor(t, 3*time.Minute, "every input to be copied after the restart", func() bool { return progress.n.Load() >= n })
	for i, p := range procs {
		if err := p.stop(t); err != nil {
			t.Fatalf("processor %d stopped with %v", i, err)
		}
	}
	t.Logf("verifier: %v", k.VerifyInputs(inputs, out, verifyTimeout))
}

// A predecessor with the processor's transactional id died (or lost the
// broker) between committing offsets into its transaction and ending it: the
// transaction stays open, and its pending offset commit makes the group's
// offset fetch answer UNSTABLE_OFFSET_COMMIT. A processor that waits for
// records before claiming its transactional id gets none, so it stalls until
// the broker times the transaction out (5 minutes here). The processor must
// instead abort it at once and copy everything; and since the pending commit
// (offset 500 on partition 0) is aborted, not applied, nothing is lost.
func TestProcessorAbortsPredecessorsOpenTransactionAtStart(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(2), k.NewTopic(2)
	group := integration.UniqueName(t, "g")
	const n = 2_000
	inputs := k.Seed(in, n)
	opts := processorOpts(k, group, in, "0")
	txnID, err := eos.StableTransactionalID(group, "0")
	if err != nil {
		t.Fatal(err)
	}
	testbed.LeaveOpenTransactionWithOffsets(t, k, txnID, group, in, 500, 5*time.Minute)

	progress := followCommitted(t, k, out)
	p := startProcessor(t, copyHandler(out), opts...)
	waitFor(t, time.Minute, "every input copied, well before the open transaction's 5-minute timeout", func() bool { return progress.n.Load() >= n })
	if err := p.stop(t); err != nil {
		t.Fatalf("processor stopped with %v", err)
	}
	t.Logf("verifier: %v", k.VerifyTopic(inputs, out, verifyTimeout))
}

// The hanging-transaction tests run on a private three-node cluster on
// Kafka's defaults where they matter (scripts/kafka-cluster.sh: 50
// partitions of __consumer_offsets and __transaction_state, RF=3,
// min.insync.replicas=2), with groups and transactional ids whose Java
// hash is negative: a check that maps a group to its offsets partition
// with the wrong sign looks elsewhere for about half of all names, which
// a broker with one offsets partition never shows. The cluster is
// private because planting a hang turns transaction verification off
// cluster-wide.
func TestProcessorAtHangingTransactions(t *testing.T) {
	t.Parallel()
	c := testbed.StartLocalCluster(t)
	t.Run("Closes", func(t *testing.T) { closesItsHangingTransactionWithItsOutcome(t, c.KafkaCluster) })
	t.Run("StopsOrWaits", func(t *testing.T) { stopsOrWaitsAtItsHangingTransactionWithoutWritingMarkers(t, c.KafkaCluster) })
}

// hangingGroup returns a unique group whose Java hash is negative, as is
// its processor 0's transactional id's.
func hangingGroup(t *testing.T) string {
	t.Helper()
	return testbed.UniqueNegativeHashName(t, "g", func(g string) string {
		id, _ := eos.StableTransactionalID(g, "0")
		return id
	})
}

// hungOffsetsPartition returns the partition of __consumer_offsets in
// which the broker holds txnID's producer open, read from the broker
// (DescribeProducers), not computed, after checking that the topic has
// Kafka's default 50 partitions.
func hungOffsetsPartition(ctx context.Context, t *testing.T, k *integration.KafkaCluster, txnID string) int32 {
	t.Helper()
	described, err := k.Admin.DescribeTransactions(ctx, txnID)
	if err != nil {
		t.Fatalf("DescribeTransactions: %v", err)
	}
	topics, err := k.Admin.ListTopics(ctx, "__consumer_offsets")
	if err != nil {
		t.Fatalf("ListTopics: %v", err)
	}
	if n := len(topics["__consumer_offsets"].Partitions); n != 50 {
		t.Fatalf("__consumer_offsets has %d partitions; the hanging tests run on Kafka's default of 50", n)
	}
	producers, err := k.Admin.DescribeProducers(ctx, topics.TopicsSet())
	if err != nil {
		t.Fatalf("DescribeProducers: %v", err)
	}
	found := int32(-1)
	producers.EachProducer(func(p kadm.DescribedProducer) {
		if p.ProducerID == described[txnID].ProducerID && p.CurrentTxnStartOffset >= 0 {
			found = p.Partition
		}
	})
	if found < 0 {
		t.Fatalf("no partition of __consumer_offsets holds %s open", txnID)
	}
	return found
}

// A predecessor's transaction hangs in the group's offsets partition
// (KIP-664), as Kafka 4.4 leaves one after broker bounces: its coordinator
// ended it, or lost it, but its offset commit (offset 500 on partition 0)
// stays pending with no marker to come, and the group's partition 0 is
// blocked for good. A processor with the same transactional id that opted
// in to RepairHangingTransactions must close it with the coordinator's
// outcome: a commit applies the offset (the
// predecessor had done partition 0 up to 500, and redoing it would
// duplicate); an abort, or a transaction the coordinator never registered
// (it can never have committed), discards it (nothing up to 500 was done,
// and skipping it would lose). The test builds the state (see
// testbed.LeaveHangingTransaction) and checks it does not
// clear by itself.
func closesItsHangingTransactionWithItsOutcome(t *testing.T, k *integration.KafkaCluster) {
	for name, end := range map[string]testbed.HangingEnd{"committed": testbed.HangCommitted, "aborted": testbed.HangAborted, "forgotten": testbed.HangForgotten} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in, out, side := k.NewTopic(2), k.NewTopic(2), k.NewTopic(1)
			group := hangingGroup(t)
			const n, pending = 2_000, 500
			inputs := k.Seed(in, n)
			opts := processorOpts(k, group, in, "0")
			txnID, err := eos.StableTransactionalID(group, "0")
			if err != nil {
				t.Fatal(err)
			}
			testbed.LeaveHangingTransaction(t, k, txnID, group, in, side, pending, end)
			time.Sleep(10 * time.Second)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			testbed.RequireUnstable(ctx, t, k, group, in) // it does not heal
			repair := append(opts, eos.HangingTransactionCheck(time.Second), eos.OnHangingTransaction(eos.RepairHangingTransactions()))
			if testbed.TransactionVersion(t, k) < 2 {
				// Transaction protocol v1 (Kafka 3.x): an epoch spans
				// many transactions, so no outcome can be known, and
				// the repair is refused before anything is written.
				runErr := startProcessor(t, copyHandler(out), repair...).wait(t, time.Minute)
				var ce *eoskit.ConfigError
				if !errors.As(runErr, &ce) || ce.Setting != "OnHangingTransaction" {
					t.Fatalf("Run returned %v; want a *ConfigError refusing OnHangingTransaction on transaction protocol v1", runErr)
				}
				testbed.RequireUnstable(ctx, t, k, group, in)
				t.Logf("refused: %v", runErr)
				return
			}

			want := inputs
			if end == testbed.HangCommitted {
				// The predecessor's commit covered partition 0 below 500.
				done := map[string]bool{}
				for _, r := range k.ReadAll(in, kgo.ReadCommitted(), verifyTimeout) {
					if r.Partition == 0 && r.Offset < pending {
						done[string(r.Value)] = true
					}
				}
				want = nil
				for _, v := range inputs {
					if !done[v] {
						want = append(want, v)
					}
				}
			}
			progress := followCommitted(t, k, out)
			p := startProcessor(t, copyHandler(out), repair...)
			waitFor(t, time.Minute, "every input left to do copied", func() bool { return progress.n.Load() >= int64(len(want)) })
			if err := p.stop(t); err != nil {
				t.Fatalf("processor stopped with %v", err)
			}
			t.Logf("%d inputs left to do; verifier: %v", len(want), k.VerifyTopic(want, out, verifyTimeout))
		})
	}
}

// The same hanging transactions without opting in to repair. By default
// the processor must write nothing: Run returns a *HangingTransactionError
// naming the partition, the producer, where the transaction starts and the
// outcome its records have, the hang is still there afterwards, and
// nothing was copied (a transaction of its own would have joined the
// hanging one). Under WaitWhenHanging it holds, copying nothing, until an
// operator closes the transaction (here, by hand with WriteTxnMarkers, as
// kafka-transactions.sh does), then copies every input once.
func stopsOrWaitsAtItsHangingTransactionWithoutWritingMarkers(t *testing.T, k *integration.KafkaCluster) {
	cases := map[string]struct {
		end     testbed.HangingEnd
		policy  eos.HangingPolicy
		outcome string
	}{
		"stop/committed": {testbed.HangCommitted, eos.StopWhenHanging(), "committed"},
		"stop/forgotten": {testbed.HangForgotten, eos.StopWhenHanging(), "aborted"},
		"wait/aborted":   {testbed.HangAborted, eos.WaitWhenHanging(), "aborted"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in, out, side := k.NewTopic(2), k.NewTopic(2), k.NewTopic(1)
			group := hangingGroup(t)
			const n, pending = 1_000, 500
			inputs := k.SeedHostile(in, n, 100)
			txnID, err := eos.StableTransactionalID(group, "0")
			if err != nil {
				t.Fatal(err)
			}
			testbed.LeaveHangingTransaction(t, k, txnID, group, in, side, pending, c.end)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			metrics := &countingMetrics{}
			opts := append(processorOpts(k, group, in, "0"), eos.HangingTransactionCheck(time.Second), eos.WithMetrics(metrics))
			if name != "stop/committed" { // the default is stop
				opts = append(opts, eos.OnHangingTransaction(c.policy))
			}
			before, err := k.Admin.DescribeTransactions(ctx, txnID)
			if err != nil {
				t.Fatalf("DescribeTransactions: %v", err)
			}
			progress := followCommitted(t, k, out)
			p := startProcessor(t, copyHandler(out), opts...)
			if c.policy == eos.StopWhenHanging() {
				runErr := p.wait(t, 2*time.Minute)
				want := c.outcome
				if testbed.TransactionVersion(t, k) < 2 {
					want = "unknown" // protocol v1: an epoch spans many transactions
				}
				var h *eos.HangingTransactionError
				hung := hungOffsetsPartition(ctx, t, k, txnID)
				if !errors.As(runErr, &h) || !errors.Is(runErr, eos.ErrHangingTransaction) || h.Topic != "__consumer_offsets" || h.Partition != hung || h.Outcome != want {
					t.Fatalf("Run returned %v; want a *HangingTransactionError in __consumer_offsets[%d] with outcome %s", runErr, hung, want)
				}
				testbed.RequireUnstable(ctx, t, k, group, in) // left as it was: no marker written
				// Not registered either: that bumps the epoch, and with
				// it goes the coordinator's evidence of the outcome.
				after, err := k.Admin.DescribeTransactions(ctx, txnID)
				if err != nil {
					t.Fatalf("DescribeTransactions: %v", err)
				}
				if b, a := before[txnID], after[txnID]; a.State != b.State || a.ProducerEpoch != b.ProducerEpoch {
					t.Fatalf("the coordinator went from %s at epoch %d to %s at %d: the processor registered its id past a hang", b.State, b.ProducerEpoch, a.State, a.ProducerEpoch)
				}
				if got := metrics.hanging.Load(); got != 1 {
					t.Fatalf("HangingTransaction called %d times; want once", got)
				}
				if got := len(k.ReadNow(out, kgo.ReadUncommitted(), 10*time.Second)); got != 0 {
					t.Fatalf("%d records written to the output; the processor must not begin a transaction past a hanging one", got)
				}
				t.Logf("Run: %v", runErr)
				return
			}
			time.Sleep(5 * time.Second)
			if got := progress.n.Load(); got != 0 {
				t.Fatalf("%d records copied while the transaction hung", got)
			}
			select {
			case <-p.finished:
				t.Fatalf("Run returned %v; under WaitWhenHanging it must wait", p.err)
			default:
			}
			closeHangingByHand(ctx, t, k, txnID, false)
			waitFor(t, 2*time.Minute, "every input copied once the transaction was closed", func() bool { return progress.n.Load() >= n })
			if err := p.stop(t); err != nil {
				t.Fatalf("processor stopped with %v", err)
			}
			t.Logf("verifier: %v", k.VerifyInputs(inputs, out, verifyTimeout))
		})
	}
}

// closeHangingByHand writes the marker an operator would (as
// kafka-transactions.sh does) to every partition of __consumer_offsets that
// holds txnID's producer open.
func closeHangingByHand(ctx context.Context, t *testing.T, k *integration.KafkaCluster, txnID string, commit bool) {
	t.Helper()
	described, err := k.Admin.DescribeTransactions(ctx, txnID)
	if err != nil {
		t.Fatalf("DescribeTransactions: %v", err)
	}
	pid := described[txnID].ProducerID
	topics, err := k.Admin.ListTopics(ctx, "__consumer_offsets")
	if err != nil {
		t.Fatalf("ListTopics: %v", err)
	}
	producers, err := k.Admin.DescribeProducers(ctx, topics.TopicsSet())
	if err != nil {
		t.Fatalf("DescribeProducers: %v", err)
	}
	closed := 0
	producers.EachProducer(func(p kadm.DescribedProducer) {
		if p.ProducerID != pid || p.CurrentTxnStartOffset < 0 {
			return
		}
		resp, err := k.Admin.WriteTxnMarkers(ctx, kadm.TxnMarkers{ProducerID: pid, ProducerEpoch: p.ProducerEpoch,
			CoordinatorEpoch: p.CoordinatorEpoch, Commit: commit, Topics: kadm.TopicsSet{p.Topic: {p.Partition: {}}}})
		if err == nil {
			resp.EachPartition(func(r kadm.TxnMarkersPartitionResponse) { err = errors.Join(err, r.Err) })
		}
		if err != nil {
			t.Fatalf("WriteTxnMarkers: %v", err)
		}
		closed++
	})
	if closed == 0 {
		t.Fatal("no hanging transaction of " + txnID + " to close")
	}
}

// Broker bounces on a three-node cluster (RF=3, min.insync.replicas=2),
// with the hanging-transaction check at its default (detect and stop, no
// marker ever written): SIGKILL of the node leading an output partition,
// SIGKILL of the node coordinating a processor's transactions, each started
// again (a clean rolling restart of all three is make chaos's
// cluster-rolling-restart row, on every path). Run by make chaos (about
// 3.5 minutes and three brokers' JVMs beside make test's other tests);
// make containers runs its twin on three broker containers,
// TestProcessorExactlyOnceThroughBrokerContainerStopAndStart. Leadership moves on
// every bounce, so no partition is leaderless while markers are written
// (KAFKA-20734 needs that), and nothing may hang: every input copied
// exactly once, no processor stopped (a hang would stop it with
// *HangingTransactionError), and no transaction left open in any partition
// at the end (DescribeProducers). Inputs come from a transactional producer
// that also aborts.
func TestProcessorExactlyOnceThroughBrokerBouncesOnACluster(t *testing.T) {
	chaosSuite(t, "make containers runs its twin, TestProcessorExactlyOnceThroughBrokerContainerStopAndStart")
	t.Parallel()
	c := testbed.StartLocalCluster(t)
	copyThroughBounces(t, c.KafkaCluster, func(ctx context.Context, node func(what) int) []bounce {
		return []bounce{
			{1.0 / 3, "SIGKILL the leader of an output partition", func() error {
				n := node(outputLeader)
				if err := c.Kill(ctx, n); err != nil {
					return err
				}
				return c.StartNode(ctx, n)
			}},
			{2.0 / 3, "SIGKILL the transaction coordinator of processor 0", func() error {
				n := node(coordinator)
				if err := c.Kill(ctx, n); err != nil {
					return err
				}
				return c.StartNode(ctx, n)
			}},
		}
	})
}

// The same on three broker containers (integration.StartCluster, run by
// make containers, not make test's containers suite): the container of the node leading an output partition stopped
// (SIGTERM) and started again, then the container of the node coordinating
// processor 0's transactions killed, removed, and replaced by a new
// container on the node's volume, which is all the new node knows.
func TestProcessorExactlyOnceThroughBrokerContainerStopAndStart(t *testing.T) {
	containersSuite(t)
	c := integration.StartCluster(t)
	copyThroughBounces(t, c.KafkaCluster, func(ctx context.Context, node func(what) int) []bounce {
		return []bounce{
			{1.0 / 3, "stop and start the container of an output partition's leader", func() error {
				n := node(outputLeader)
				if err := c.Nodes.Stop(ctx, n, time.Minute); err != nil {
					return err
				}
				return c.Nodes.Start(ctx, n)
			}},
			{2.0 / 3, "kill the container of processor 0's transaction coordinator and replace it on its volume", func() error {
				return c.Nodes.Replace(ctx, node(coordinator))
			}},
		}
	})
}

// what names a node by its role in copyThroughBounces.
type what int

const (
	outputLeader what = iota // leads the output's partition 0
	coordinator              // coordinates processor 0's transactions
)

// bounce is a fault copyThroughBounces injects once the output holds the
// fraction at of the inputs.
type bounce struct {
	at   float64
	what string
	do   func() error
}

// copyThroughBounces copies 15,000 hostile inputs (a transactional
// producer that also aborts, three partitions) with two processors while
// the bounces happen, each once an output transaction is open, and checks
// that no processor stopped, that the
// verifier finds every input exactly once, in order, and no aborted one,
// and that no transaction is left open in any partition.
func copyThroughBounces(t *testing.T, k *integration.KafkaCluster, bounces func(ctx context.Context, node func(what) int) []bounce) {
	t.Helper()
	in, out := k.NewTopic(3), k.NewTopic(3)
	group := integration.UniqueName(t, "g")
	inputs := k.SeedHostile(in, 15_000, 500)
	n := int64(len(inputs.Committed))
	progress := followCommitted(t, k, out)
	// Handlers slow down while a bounce is under way, so that the copy
	// goes on through it (a fault that lands after the last input proves
	// nothing; one that lands before is checked below).
	var bouncing atomic.Bool
	slow := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if bouncing.Load() {
			time.Sleep(10 * time.Millisecond)
		} else {
			time.Sleep(200 * time.Microsecond)
		}
		return copyHandler(out)(ctx, r)
	}
	procs := []*running{
		startProcessor(t, slow, processorOpts(k, group, in, "0")...),
		startProcessor(t, slow, processorOpts(k, group, in, "1")...),
	}
	txnID, err := eos.StableTransactionalID(group, "0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	node := func(w what) int {
		switch w {
		case outputLeader:
			md, err := k.Admin.Metadata(ctx, out)
			if err != nil {
				t.Fatalf("metadata: %v", err)
			}
			return int(md.Topics[out].Partitions[0].Leader)
		default:
			resp := k.Admin.FindTxnCoordinators(ctx, txnID)
			r, ok := resp[txnID]
			if !ok || r.Err != nil {
				t.Fatalf("find coordinator of %s: %v", txnID, r.Err)
			}
			return int(r.NodeID)
		}
	}
	for _, b := range bounces(ctx, node) {
		at := int64(float64(n) * b.at)
		waitFor(t, 3*time.Minute, fmt.Sprintf("%d outputs before %s", at, b.what), func() bool { return progress.n.Load() >= at })
		// The fault strikes while an output transaction is open (written,
		// not committed): what a weaker design loses or doubles.
		waitFor(t, time.Minute, "an open output transaction before "+b.what, func() bool {
			hwm, lso := endOffsets(t, k.Admin, out)
			return hwm > lso
		})
		start, before := time.Now(), progress.n.Load()
		if before >= n {
			t.Fatalf("every input was copied before %s: the fault would not strike mid-copy", b.what)
		}
		bouncing.Store(true)
		err := b.do()
		bouncing.Store(false)
		if err != nil {
			t.Fatalf("%s: %v", b.what, err)
		}
		t.Logf("%s from %d to %d outputs, %s", b.what, before, progress.n.Load(), time.Since(start).Round(time.Millisecond))
		for i, p := range procs {
			select {
			case <-p.finished:
				t.Fatalf("processor %d returned %v after %s", i, p.err, b.what)
			default:
			}
		}
	}
	waitFor(t, 3*time.Minute, "every input copied", func() bool { return progress.n.Load() >= n })
	for i, p := range procs {
		if err := p.stop(t); err != nil {
			t.Fatalf("processor %d stopped with %v", i, err)
		}
	}
	rep := k.VerifyInputs(inputs, out, verifyTimeout)
	// Nothing left open anywhere: the inputs, the outputs and the
	// group's offsets.
	if open := testbed.OpenTransactions(t, k, in, out); len(open) > 0 {
		t.Errorf("transactions left open: %v", open)
	}
	t.Logf("verifier: %v; no transaction open in the input, the output or the offsets topic", rep)
}
