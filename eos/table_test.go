package eos_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// seedRegions writes the region table as a transactional producer
// upstream would, each committed transaction followed by one that aborts:
// eight regions named 44 times (the fourth name of region 3 a tombstone)
// at times 5 s apart from base, so that most of the join's transactions
// write the table to the changelog; the aborted transactions rename every
// region "ABORTED", which no join may see.
func seedRegions(t *testing.T, ctx context.Context, k *integration.KafkaCluster, topic string, base time.Time) {
	t.Helper()
	if _, _, err := integration.SeedTransactional(ctx, k.Brokers, topic, 44*8, 8, func(r *kgo.Record) {
		id := string(r.Value)
		n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
		v, region := n/8, n%8
		r.Key = fmt.Appendf(nil, "r%d", region)
		// Up to 12 s after its version's start: a partition's records
		// are not in time order, and the advance must stop at the
		// first later one.
		r.Timestamp = base.Add(time.Duration(v)*5*time.Second + time.Duration(region)*1700*time.Millisecond)
		switch {
		case strings.HasPrefix(id, "aborted-"):
			r.Value = []byte("ABORTED")
		case n == 27:
			r.Value = nil
		default:
			r.Value = fmt.Appendf(nil, "region %d v%d", region, v)
		}
	}); err != nil {
		t.Fatal(err)
	}
}

// Cases joined with the region table as of their time, exactly once,
// through a joining process SIGKILLed while its transaction holds joins
// (the table advanced for them, not yet in the changelog), its replacement
// restoring the table from the changelog, and a second instance joining
// and leaving (a rebalance). The table and the cases come from
// transactional producers that also abort, over four partitions; the
// cases out of order in time, some of regions the table never holds,
// some bad (dead-lettered). Checked from outside with verify.TableJoin:
// every good case joined once, with the committed table version its time
// reaches, never an aborted one.
func TestJoinTableIsExactThroughACrash(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	cases, regions, joined, dead := k.NewTopic(4), k.NewTopic(4), k.NewTopic(4), k.NewTopic(4)
	changelog := newChangelog(t, k, 4)
	group := integration.UniqueName(t, "join")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := time.Now().Add(-30 * time.Minute)
	seedRegions(t, ctx, k, regions, base)
	seedCases(t, ctx, k, cases, base, 8_000)

	victim := startCopier(t, k, eos.ExactlyOnce, cases, joined, group, group+"-0",
		"EOS_COPIER_CHANGELOG="+changelog, "EOS_COPIER_JOIN="+regions, "EOS_COPIER_DEAD="+dead)
	// The kill lands in a transaction whose joins are written (the
	// table advanced for them in the keyed state, its changelog records
	// written at the commit), after the table's first commit.
	waitFor(t, 2*time.Minute, "an open transaction with joins, after the table's first commit", func() bool {
		_, committed := endOffsets(t, k.Admin, changelog)
		hwm, lso := endOffsets(t, k.Admin, joined)
		return hwm > lso && committed > 0
	})
	victim.kill()

	// Each instance has a Table of its own: a Table follows its topic
	// for one processor's Run at a time.
	start := func(instance string) *running {
		table := eos.NewTable(regions)
		return startProcessor(t, eos.JoinTable(table, joinCasesTo(joined)), append(processorOpts(k, group, cases, instance),
			eos.WithTables(table), eos.Changelog(changelog), eos.OnHandlerError(eos.DeadLetter(dead)), eos.MaxRecordsPerCommit(500))...)
	}
	a := start("0")
	waitFor(t, 2*time.Minute, "the replacement to restore and join", func() bool { return len(a.p.State().Partitions()) > 0 })
	b := start("1")
	waitFor(t, 2*time.Minute, "the second instance to hold partitions", func() bool { return len(b.p.State().Partitions()) > 0 })
	if err := b.stop(t); err != nil {
		t.Fatalf("instance 1 stopped with %v", err)
	}
	k.WaitCaughtUp(group, cases, 3*time.Minute)
	if err := a.stop(t); err != nil {
		t.Fatalf("instance 0 stopped with %v", err)
	}
	checkJoin(t, []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, cases, regions, joined)
}

// seedCases writes n cases over ten regions to topic from a transactional
// producer that also aborts: over 220 s of time from base in order, each
// up to 10 s early or late; every 997th bad.
func seedCases(t *testing.T, ctx context.Context, k *integration.KafkaCluster, topic string, base time.Time, n int) {
	t.Helper()
	if _, _, err := integration.SeedTransactional(ctx, k.Brokers, topic, n, 400, func(r *kgo.Record) {
		id := string(r.Value)
		i, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
		r.Key = fmt.Appendf(nil, "r%d", i%10)
		r.Timestamp = base.Add(time.Duration(i)*220*time.Second/time.Duration(n) + time.Duration(i*7919%20_000-10_000)*time.Millisecond)
		if i%997 == 13 {
			r.Value = []byte("bad")
		}
	}); err != nil {
		t.Fatal(err)
	}
}

// The join while a second instance joins mid-stream and leaves, under
// range (eager: every partition revoked, its table buffer dropped and its
// position restored with the state), cooperative-sticky and KIP-848's
// consumer protocol: every good case joined once with the table as of its time.
func TestJoinTableIsExactUnderEachRebalanceProtocol(t *testing.T) {
	t.Parallel()
	underEachRebalanceProtocol(t, func(t *testing.T, k *integration.KafkaCluster, name string, opt eos.ProcessorOption) {
		cases, regions, joined, dead := k.NewTopic(4), k.NewTopic(4), k.NewTopic(4), k.NewTopic(4)
		changelog := newChangelog(t, k, 4)
		group := integration.UniqueName(t, "join-"+name)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		base := time.Now().Add(-30 * time.Minute)
		seedRegions(t, ctx, k, regions, base)
		const n = 6_000
		seedCases(t, ctx, k, cases, base, n)
		var handled atomic.Int64
		start := func(instance string) *running {
			table := eos.NewTable(regions)
			join := eos.JoinTable(table, joinCasesTo(joined))
			paced := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
				time.Sleep(300 * time.Microsecond) // so that the join lands mid-stream
				handled.Add(1)
				return join(ctx, r)
			}
			return startProcessor(t, paced, append(processorOpts(k, group, cases, instance), opt,
				eos.WithTables(table), eos.Changelog(changelog), eos.OnHandlerError(eos.DeadLetter(dead)), eos.MaxRecordsPerCommit(500))...)
		}
		a := start("0")
		waitFor(t, 2*time.Minute, "the first instance to join", func() bool { return len(a.p.State().Partitions()) > 0 })
		b := start("1")
		waitFor(t, 2*time.Minute, "the second instance to hold partitions", func() bool { return len(b.p.State().Partitions()) > 0 })
		if handled.Load() >= n {
			t.Fatal("every case was joined before the second instance held a partition: no rebalance mid-stream")
		}
		if err := b.stop(t); err != nil {
			t.Fatalf("instance 1 stopped with %v", err)
		}
		k.WaitCaughtUp(group, cases, 3*time.Minute)
		if err := a.stop(t); err != nil {
			t.Fatalf("instance 0 stopped with %v", err)
		}
		checkJoin(t, []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, cases, regions, joined)
	})
}
