package eos_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/internal/loop"
)

// Under Kafka's consumer group protocol (KIP-848, eos.ConsumerProtocol) on
// Kafka 4.4: three processors copy 20,000 records while one leaves
// mid-stream, another joins, and a second leaves; the group is a consumer
// group (the option took: franz-go falls back to the classic protocol
// silently), and every input is in the output once. Revokes are
// incremental there: a transaction whose partitions are taken aborts, and
// the partitions a member keeps are never fetched again.
func TestProcessorExactlyOnceUnderTheConsumerProtocol(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	consumerProtocolServed(t, k)
	in, out := k.NewTopic(6), k.NewTopic(6)
	group := integration.UniqueName(t, "kip848")
	const n = 20_000
	inputs := k.Seed(in, n)
	progress := followCommitted(t, k, out)
	copyTo := copyHandler(out)
	h := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		time.Sleep(100 * time.Microsecond) // paced, so that the churn lands mid-stream
		return copyTo(ctx, r)
	}
	metrics := map[string]*countingMetrics{}
	start := func(instance string) *running {
		metrics[instance] = &countingMetrics{}
		return startProcessor(t, h, append(processorOpts(k, group, in, instance), eos.ConsumerProtocol(), eos.WithMetrics(metrics[instance]))...)
	}
	procs := map[string]*running{"a": start("a"), "b": start("b"), "c": start("c")}
	waitFor(t, time.Minute, "the group to be a consumer-protocol group with members", func() bool {
		described, err := k.Admin.DescribeConsumerGroups(t.Context(), group)
		return err == nil && described[group].Err == nil && len(described[group].Members) > 0
	})
	for _, step := range []struct {
		at          int64
		leave, join string
	}{{n / 4, "b", "d"}, {n / 2, "a", ""}} {
		waitFor(t, 2*time.Minute, "output to pass the next milestone", func() bool { return progress.n.Load() >= step.at })
		if err := procs[step.leave].stop(t); err != nil {
			t.Fatalf("instance %s stopped with %v", step.leave, err)
		}
		if progress.n.Load() >= n {
			t.Fatalf("%s left after every record was done: no churn mid-stream", step.leave)
		}
		delete(procs, step.leave)
		if step.join != "" {
			procs[step.join] = start(step.join)
		}
	}
	waitFor(t, 3*time.Minute, "every input copied", func() bool { return progress.n.Load() >= n })
	for name, p := range procs {
		if err := p.stop(t); err != nil {
			t.Fatalf("instance %s stopped with %v", name, err)
		}
	}
	var revokes int64
	for _, m := range metrics {
		revokes += m.rebalances.Load()
	}
	if revokes == 0 {
		t.Fatal("no member saw a revoke: the churn never moved a partition")
	}
	t.Logf("revokes %d; verifier: %v", revokes, k.VerifyTopic(inputs, out, verifyTimeout))
}

// ConsumerProtocol on a cluster that cannot serve it well is an
// *eoskit.ConfigError naming it, from Run, within seconds: here a
// balancer franz-go would not take for it (round-robin), which would
// otherwise join with the classic protocol without a word.
func TestConsumerProtocolWithABalancerItCannotTakeIsRefused(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in := k.NewTopic(1)
	p, err := eos.NewProcessor(copyHandler(in), append(processorOpts(k, integration.UniqueName(t, "g"), in, "0"), eos.ConsumerProtocol(),
		eos.ClientOptions(kgo.Balancers(kgo.RoundRobinBalancer())))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = p.Run(ctx)
	if cerr, ok := errors.AsType[*eoskit.ConfigError](err); !ok || cerr.Setting != "ConsumerProtocol" {
		t.Fatalf("Run returned %v; want an *eoskit.ConfigError naming ConsumerProtocol", err)
	}
}

// Keyed state under the consumer protocol: eos.Count's totals are exact
// while a second instance joins (its partitions, revoked incrementally
// from the first, are restored there from the changelog) and leaves
// (restored on the first again). Checked as TestCountIsExactThroughCrashesAndRebalances
// checks it: the updates topic and the changelog end at the true totals,
// each key's counts only growing, and no view passes a true total.
func TestCountIsExactUnderTheConsumerProtocol(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	consumerProtocolServed(t, k)
	in, updates := k.NewTopic(4), k.NewTopic(4)
	changelog := newChangelog(t, k, 4)
	group := integration.UniqueName(t, "kip848")
	want := seedReports(t, k, in, 20_000)
	opts := func(instance string) []eos.ProcessorOption {
		return append(statefulOpts(k, group, in, changelog, updates, instance), eos.ConsumerProtocol())
	}
	var counted atomic.Int64
	count := eos.Count()
	paced := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		time.Sleep(200 * time.Microsecond) // so that the join and the leave land mid-stream
		out, err := count(ctx, r)
		counted.Add(1)
		return out, err
	}
	a := startProcessor(t, paced, opts("0")...)
	waitFor(t, 2*time.Minute, "the first instance to restore and count", func() bool { return len(a.p.State().Partitions()) > 0 })
	b := startProcessor(t, paced, opts("1")...)
	waitFor(t, 2*time.Minute, "the second instance to hold partitions", func() bool { return len(b.p.State().Partitions()) > 0 })
	if counted.Load() >= 20_000 {
		t.Fatal("every report was counted before the second instance held a partition: no rebalance mid-stream")
	}
	countEndsAtTotals(t, k, a, b, want, updates, changelog)
}

// consumerProtocolServed skips t where the broker cannot serve the
// consumer protocol well (make compat runs eos's tests on Kafka 3.9):
// there ConsumerProtocol is refused, which
// TestConsumerProtocolWithABalancerItCannotTakeIsRefused and
// internal/loop's TestConsumerProtocolRefusal check.
func consumerProtocolServed(t *testing.T, k *integration.KafkaCluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	refusal, err := loop.CheckConsumerProtocol(ctx, k.Client())
	if err != nil {
		t.Fatalf("ask the brokers whether they serve the consumer protocol: %v", err)
	}
	if refusal != "" {
		t.Skipf("the consumer protocol is refused on this cluster: %s", refusal)
	}
}

// underEachRebalanceProtocol runs test, in parallel subtests, under the
// classic protocol's eager range balancer (every partition revoked at
// each rebalance), its cooperative-sticky balancer (franz-go's default:
// only the partitions that move are revoked, over two rebalances) and
// KIP-848's consumer protocol, each with a cluster and the processor
// option that selects the protocol.
func underEachRebalanceProtocol(t *testing.T, test func(t *testing.T, k *integration.KafkaCluster, name string, protocol eos.ProcessorOption)) {
	t.Helper()
	for name, opt := range map[string]eos.ProcessorOption{
		"range":              eos.ClientOptions(kgo.Balancers(kgo.RangeBalancer())),
		"cooperative-sticky": eos.ClientOptions(kgo.Balancers(kgo.CooperativeStickyBalancer())),
		"kip-848":            eos.ConsumerProtocol(),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k := integration.Kafka(t)
			if name == "kip-848" {
				consumerProtocolServed(t, k)
			}
			test(t, k, name, opt)
		})
	}
}
