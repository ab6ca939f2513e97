package eos_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/state"
)

// restoreLog records each restore's partition and the records it read.
type restoreLog struct {
	eoskit.Metrics
	mu    sync.Mutex
	reads []int // records read per restore, in order
	parts []int32
}

func (r *restoreLog) Restored(_ string, partition int32, _ int64, records int, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads = append(r.reads, records)
	r.parts = append(r.parts, partition)
}

func (r *restoreLog) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reads)
}

func (r *restoreLog) since(i int) (parts []int32, read int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for j := i; j < len(r.reads); j++ {
		parts = append(parts, r.parts[j])
		read += r.reads[j]
	}
	return parts, read
}

// Under an eager balancer (range) a second member's join revokes every
// partition of the first, then gives it some back: their memory stores,
// set aside rather than closed, are restored from their checkpoints (the
// changelog's tail: nothing, no record came since) instead of from the
// changelog's start. The counts stay exact through it.
func TestAnEagerRebalanceKeepsTheStoresGivenBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rr := newRegionReports(t, ctx)
	rr.produce(4_000)
	brokers, want, adm := rr.brokers, rr.want, rr.adm
	start := func(instance string, m eoskit.Metrics) (*eos.Processor, context.CancelFunc, chan error) {
		p, err := eos.NewProcessor(eos.Count(), eos.Brokers(brokers...), eos.Group("eager"), eos.Topics("reports"), eos.TransactionalID("eager-"+instance),
			eos.CommitInterval(20*time.Millisecond), eos.MaxRecordsPerCommit(100), eos.Logger(testLogger(t)), eos.WithMetrics(m),
			eos.ClientOptions(kgo.Balancers(kgo.RangeBalancer())), eos.Changelog("eager-changelog", eos.CreateChangelog(), eos.EmitUpdates("counts")))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		return p, stop, done
	}
	logA := &restoreLog{Metrics: eoskit.NopMetrics{}}
	a, stopA, doneA := start("a", logA)
	waitCommitted(t, ctx, adm, "eager", "reports")
	for len(a.State().Partitions()) != 4 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	before := logA.count()

	b, stopB, doneB := start("b", &restoreLog{Metrics: eoskit.NopMetrics{}})
	for (len(a.State().Partitions()) != 2 || len(b.State().Partitions()) != 2) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatalf("the two members did not split the four partitions: a holds %v, b %v", a.State().Partitions(), b.State().Partitions())
	}
	parts, read := logA.since(before)
	if len(parts) < 2 {
		t.Fatalf("a restored %v after the rebalance, want the two partitions it got back", parts)
	}
	if read != 0 {
		t.Fatalf("a read %d changelog records restoring the partitions given back, want 0 (their stores kept, no record since)", read)
	}
	for key, n := range want {
		var got []byte
		for _, p := range []*eos.Processor{a, b} {
			if v, ok, err := p.State().Lookup([]byte(key)); err == nil && ok {
				got = v
			}
		}
		if string(got) != strconv.Itoa(n) {
			t.Errorf("%s: %q after the rebalance, want %d", key, got, n)
		}
	}
	stopB()
	stopA()
	for _, done := range []chan error{doneA, doneB} {
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}

// slowStores makes memory stores whose Apply takes 50 ms, noting how
// many run at once.
type slowStores struct {
	mu            sync.Mutex
	inFlight, top int
}

type slowStore struct {
	state.Store
	s *slowStores
}

func (s *slowStores) factory() state.Factory {
	return func(string, int32) (state.Store, error) { return slowStore{state.NewMemory(), s}, nil }
}

func (st slowStore) Apply(ws []state.Write, cp state.Checkpoint) error {
	st.s.mu.Lock()
	st.s.inFlight++
	st.s.top = max(st.s.top, st.s.inFlight)
	st.s.mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	st.s.mu.Lock()
	st.s.inFlight--
	st.s.mu.Unlock()
	return st.Store.Apply(ws, cp)
}

// A member given four partitions restores them side by side (at most
// maxParallelRestores at once), not one after another; the counts are
// exact after.
func TestPartitionsRestoreSideBySide(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rr := newRegionReports(t, ctx)
	rr.produce(2_000)
	brokers, want, adm := rr.brokers, rr.want, rr.adm
	run := func(stores state.Factory, until func(*eos.Processor) bool) {
		p, err := eos.NewProcessor(eos.Count(), eos.Brokers(brokers...), eos.Group("side"), eos.Topics("reports"), eos.TransactionalID("side-0"),
			eos.CommitInterval(20*time.Millisecond), eos.MaxRecordsPerCommit(50), eos.Logger(testLogger(t)),
			eos.Changelog("side-changelog", eos.CreateChangelog(), eos.Stores(stores)))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		for !until(p) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		for key, n := range want {
			if v, _, err := p.State().Lookup([]byte(key)); err != nil || string(v) != strconv.Itoa(n) {
				t.Errorf("%s: %q, %v; want %d", key, v, err, n)
			}
		}
		stop()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	run(state.MemoryFactory(), func(p *eos.Processor) bool {
		offsets, err := adm.FetchOffsets(ctx, "side")
		var at int64
		offsets.Each(func(o kadm.OffsetResponse) { at += o.At })
		if err != nil || at != 2_000 {
			return false
		}
		// The offsets' commit shows before the store takes the last
		// transaction's writes: wait for the store too (a fresh make
		// test read 43 of 50 once the offsets were in).
		for key, n := range want {
			if v, _, err := p.State().Lookup([]byte(key)); err != nil || string(v) != strconv.Itoa(n) {
				return false
			}
		}
		return true
	})
	slow := &slowStores{}
	run(slow.factory(), func(p *eos.Processor) bool { return len(p.State().Partitions()) == 4 })
	if slow.top < 2 {
		t.Fatalf("at most %d restore applied at once: the partitions restored one after another", slow.top)
	}
	t.Logf("up to %d partitions' restores applied at once", slow.top)
}

// With a standby each (eos.Standbys(1)), two members keep each other's
// partitions warm; when one leaves, the other's restore of the partitions
// it takes over reads nothing again (its standby stores had caught up
// with what the leaver counted), where without standbys it reads what
// the leaver wrote since (or the whole changelog). Counts exact.
func TestAStandbyTakesOverWithTheTailOnly(t *testing.T) {
	for _, standbys := range []int{1, 0} {
		t.Run("standbys="+strconv.Itoa(standbys), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rr := newRegionReports(t, ctx)
			brokers, want, adm, produce := rr.brokers, rr.want, rr.adm, rr.produce
			produce(1_000)
			start := func(instance string, m eoskit.Metrics) (*eos.Processor, context.CancelFunc, chan error) {
				p, err := eos.NewProcessor(eos.Count(), eos.Brokers(brokers...), eos.Group("standby"), eos.Topics("reports"), eos.TransactionalID("standby-"+instance),
					eos.CommitInterval(20*time.Millisecond), eos.MaxRecordsPerCommit(50), eos.Logger(testLogger(t)), eos.WithMetrics(m),
					eos.Endpoint("http://"+instance+".example:8080"), eos.Changelog("standby-changelog", eos.CreateChangelog(), eos.Standbys(standbys)))
				if err != nil {
					t.Fatal(err)
				}
				runCtx, stop := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- p.Run(runCtx) }()
				return p, stop, done
			}
			logA := &restoreLog{Metrics: eoskit.NopMetrics{}}
			a, stopA, doneA := start("a", logA)
			b, stopB, doneB := start("b", &restoreLog{Metrics: eoskit.NopMetrics{}})
			for (len(a.State().Partitions()) != 2 || len(b.State().Partitions()) != 2) && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			// b counts these: the changelog of its partitions grows
			// past what a kept when it held them.
			produce(1_000)
			waitCommitted(t, ctx, adm, "standby", "reports")
			if standbys > 0 {
				for !slices.Equal(a.State().Standbys(), b.State().Partitions()) && ctx.Err() == nil {
					time.Sleep(10 * time.Millisecond)
				}
				time.Sleep(2500 * time.Millisecond) // two catch-ups past the last commit
				standbysAreTheChangelog(t, ctx, a, want)
			}
			taken := b.State().Partitions()
			before := logA.count()
			stopB()
			if err := <-doneB; err != nil {
				t.Fatalf("b: %v", err)
			}
			for len(a.State().Partitions()) != 4 && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			parts, read := logA.since(before)
			for _, p := range taken {
				if !slices.Contains(parts, p) {
					t.Fatalf("a restored %v taking over, want b's %v among them", parts, taken)
				}
			}
			switch {
			case standbys > 0 && read != 0:
				t.Fatalf("a read %d changelog records taking over b's partitions %v, want 0: its standby stores were current", read, taken)
			case standbys == 0 && read == 0:
				t.Fatalf("without standbys a read nothing taking over: the test cannot tell standbys apart")
			}
			t.Logf("standbys %d: taking over %v read %d changelog records", standbys, taken, read)
			for key, n := range want {
				if v, _, err := a.State().Lookup([]byte(key)); err != nil || string(v) != strconv.Itoa(n) {
					t.Errorf("%s: %q, %v; want %d", key, v, err, n)
				}
			}
			stopA()
			if err := <-doneA; err != nil {
				t.Fatalf("a: %v", err)
			}
		})
	}
}

// standbysAreTheChangelog asserts that each standby store of p holds the
// counts of want (the truth, all committed and caught up with) of its
// partition's keys, and no other key, read stale (StandbyScan,
// StandbyLookup); and that a key of p's own partitions is no standby's.
func standbysAreTheChangelog(t *testing.T, ctx context.Context, p *eos.Processor, want map[string]int) {
	t.Helper()
	view := p.State()
	for _, part := range view.Standbys() {
		got, truth := map[string]string{}, map[string]string{}
		asOf, err := view.StandbyScan(ctx, part, nil, nil, func(k, v []byte) bool {
			got[string(k)] = string(v)
			return true
		})
		if err != nil || asOf.IsZero() {
			t.Fatalf("standby of partition %d: caught up at %v, %v", part, asOf, err)
		}
		for key, n := range want {
			if kp, _ := view.PartitionOf([]byte(key)); kp == part {
				truth[key] = strconv.Itoa(n)
				if v, ok, _, err := view.StandbyLookup(ctx, []byte(key)); err != nil || !ok || string(v) != truth[key] {
					t.Errorf("standby lookup of %s: %q, %v, %v; want %s", key, v, ok, err, truth[key])
				}
			}
		}
		if !maps.Equal(got, truth) {
			t.Errorf("standby of partition %d holds %v, want %v", part, got, truth)
		}
	}
	for key := range want {
		kp, _ := view.PartitionOf([]byte(key))
		var nh *eos.NotHeldError
		if _, _, _, err := view.StandbyLookup(ctx, []byte(key)); slices.Contains(view.Partitions(), kp) && (!errors.As(err, &nh) || nh.Partition != kp) {
			t.Errorf("standby lookup of %s, in this instance's own partition %d: %v, want a NotHeldError", key, kp, err)
		}
	}
}

// regionReports is a kfake cluster with a four-partition "reports" topic
// (and "counts"), and what writes reports over 40 regions to it,
// counting them in want.
type regionReports struct {
	brokers []string
	adm     *kadm.Client
	want    map[string]int
	produce func(n int)
}

func newRegionReports(t *testing.T, ctx context.Context) *regionReports {
	t.Helper()
	return newRegionReportsOf(t, ctx, 4)
}

// newRegionReportsOf is newRegionReports with topics of partitions.
func newRegionReportsOf(t *testing.T, ctx context.Context, partitions int32) *regionReports {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "reports", "counts"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	rr := &regionReports{brokers: cluster.ListenAddrs(), want: map[string]int{}}
	seed := reportsClient(t, rr.brokers)
	rr.adm = kadm.NewClient(seed)
	rr.produce = func(n int) {
		var recs []*kgo.Record
		for i := range n {
			key := "region-" + strconv.Itoa(i%40)
			rr.want[key]++
			recs = append(recs, &kgo.Record{Key: []byte(key)})
		}
		if err := seed.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return rr
}

// Three members, a standby each (eos.Standbys(1)), the group balanced by
// eoskit-standby-v2, whose leader places the standbys: each member's two
// partitions are kept warm on the two others, so when one leaves (one
// whose partitions have the same parity, when one has), its two
// partitions go one to each of the others, each to the member that kept
// it warm, and the takeover restores read only what the standbys had not
// caught up with, not the partitions' changelog. Before the leader
// placed them (every standby of an owner's partitions on the member
// after it, and a balancer that knew nothing of them), one of the two
// restored its whole changelog, and this test failed so. (The ring
// placement between, partition p's standby 1+p%2 members after its
// owner, failed it only when a member held partitions of one parity,
// which this group's balance does not give: TestPlanStandbysUnit shows
// that case.)
func TestALeaversPartitionsGoToTheirStandbys(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rr := newRegionReportsOf(t, ctx, 6)
	rr.produce(1_200)
	type member struct {
		p    *eos.Processor
		log  *restoreLog
		stop context.CancelFunc
		done chan error
	}
	start := func(instance string) *member {
		m := &member{log: &restoreLog{Metrics: eoskit.NopMetrics{}}, done: make(chan error, 1)}
		var err error
		m.p, err = eos.NewProcessor(eos.Count(), eos.Brokers(rr.brokers...), eos.Group("leaver"), eos.Topics("reports"), eos.TransactionalID("leaver-"+instance),
			eos.CommitInterval(20*time.Millisecond), eos.MaxRecordsPerCommit(50), eos.Logger(testLogger(t)), eos.WithMetrics(m.log),
			eos.Endpoint("http://"+instance+".example:8080"), eos.Changelog("leaver-changelog", eos.CreateChangelog(), eos.Standbys(1)))
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		m.stop = stop
		go func() { m.done <- m.p.Run(runCtx) }()
		return m
	}
	var members []*member
	for _, name := range []string{"a", "b", "c"} {
		members = append(members, start(name))
	}
	defer func() {
		for _, m := range members {
			m.stop()
		}
	}()
	waitFor(t, 30*time.Second, "two partitions on each member, each partition kept warm on another", func() bool {
		kept := 0
		for _, m := range members {
			if len(m.p.State().Partitions()) != 2 {
				return false
			}
			kept += len(m.p.State().Standbys())
		}
		return kept == 6
	})
	rr.produce(1_200)
	waitCommitted(t, ctx, rr.adm, "leaver", "reports")
	time.Sleep(2500 * time.Millisecond) // two catch-ups past the last commit
	warmOn := map[int32]*member{}       // partition: the member keeping it warm
	for _, m := range members {
		for _, p := range m.p.State().Standbys() {
			warmOn[p] = m
		}
	}
	for i, m := range members {
		if ps := m.p.State().Partitions(); warmOn[ps[0]] == warmOn[ps[1]] {
			t.Errorf("member %d's partitions %v are both kept warm on one member", i, ps)
		}
	}
	// The leaver: a member whose two partitions have the same parity
	// (the ring put their standbys on one member), else the last.
	li := len(members) - 1
	for i, m := range members {
		if ps := m.p.State().Partitions(); ps[0]%2 == ps[1]%2 {
			li = i
			break
		}
	}
	leaver := members[li]
	stayers := slices.Delete(slices.Clone(members), li, li+1)
	taken := leaver.p.State().Partitions()
	described, err := rr.adm.DescribeGroups(ctx, "leaver")
	if err != nil {
		t.Fatal(err)
	}
	if proto := described["leaver"].Protocol; proto != "eoskit-standby-v2" {
		t.Fatalf("the group balances with %q, want eoskit-standby-v2", proto)
	}
	before := []int{stayers[0].log.count(), stayers[1].log.count()}
	leaver.stop()
	if err := <-leaver.done; err != nil {
		t.Fatalf("the leaver: %v", err)
	}
	members = stayers
	read := map[int32]int{}
	on := map[int32]int{}
	waitFor(t, 30*time.Second, "the leaver's partitions restored by the others", func() bool {
		for i, m := range stayers {
			m.log.mu.Lock()
			for j := before[i]; j < len(m.log.reads); j++ {
				read[m.log.parts[j]], on[m.log.parts[j]] = m.log.reads[j], i
			}
			m.log.mu.Unlock()
		}
		for _, p := range taken {
			if _, ok := read[p]; !ok {
				return false
			}
		}
		return true
	})
	changelog := readCommitted(t, rr.brokers, "leaver-changelog")
	// Each stayer has room for one more partition, and keeps one of the
	// two warm: each lands on its standby.
	landed := 0
	for _, p := range taken {
		holder := warmOn[p]
		if holder == nil {
			t.Fatalf("no member kept partition %d warm before the leave", p)
		}
		if stayers[on[p]] != holder {
			continue
		}
		landed++
		whole := 0
		for _, r := range changelog {
			if r.Partition == p {
				whole++
			}
		}
		if read[p]*4 > whole {
			t.Errorf("partition %d read %d of its changelog's %d records, taken over on its standby: more than a quarter", p, read[p], whole)
		}
	}
	if landed != len(taken) {
		t.Errorf("%d of the leaver's partitions %v landed on their standbys, want both", landed, taken)
	}
	t.Logf("the leaver's partitions %v taken over reading %v", taken, read)
	for key, n := range rr.want {
		var got []string
		for _, m := range stayers {
			if v, ok, err := m.p.State().Lookup([]byte(key)); err == nil && ok {
				got = append(got, string(v))
			}
		}
		if len(got) != 1 || got[0] != strconv.Itoa(n) {
			t.Errorf("%s: %v, want %d on one member", key, got, n)
		}
	}
}

// readyAtReport is a RestoreMetrics that notes, at each restore's report,
// whether the processor already served the partition (its view listed
// it).
type readyAtReport struct {
	eoskit.Metrics
	p        atomic.Pointer[eos.Processor]
	mu       sync.Mutex
	early    []int32 // partitions readable before their restore was reported
	reported map[int32]bool
}

func (r *readyAtReport) Restored(_ string, partition int32, _ int64, _ int, _ time.Duration) {
	ready := slices.Contains(r.p.Load().State().Partitions(), partition)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reported == nil {
		r.reported = map[int32]bool{}
	}
	r.reported[partition] = true
	if ready {
		r.early = append(r.early, partition)
	}
}

// unreported returns the partitions the processor serves whose restore
// was never reported.
func (r *readyAtReport) unreported() []int32 {
	ready := r.p.Load().State().Partitions()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int32
	for _, p := range ready {
		if !r.reported[p] {
			out = append(out, p)
		}
	}
	return out
}

// A restore is reported before its partition is readable: whoever sees
// a partition in the view (a test waiting for a takeover, a dashboard)
// finds its restore among the reports. Checked both ways: at each report
// the partition is not yet served, and a poller of the views never sees
// a partition served unreported. The restores here (a first assignment's,
// a join's) run in the background (runRestore); restoreAll, which
// restores a partition held back in the transaction's way, reports in
// the same place.
func TestARestoreIsReportedBeforeItsPartitionIsReadable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rr := newRegionReports(t, ctx)
	rr.produce(4_000)
	start := func(instance string, m eoskit.Metrics) (*eos.Processor, context.CancelFunc, chan error) {
		p, err := eos.NewProcessor(eos.Count(), eos.Brokers(rr.brokers...), eos.Group("reported"), eos.Topics("reports"), eos.TransactionalID("reported-"+instance),
			eos.CommitInterval(20*time.Millisecond), eos.Logger(testLogger(t)), eos.WithMetrics(m),
			eos.Changelog("reported-changelog", eos.CreateChangelog(), eos.EmitUpdates("counts")))
		if err != nil {
			t.Fatal(err)
		}
		if r, ok := m.(*readyAtReport); ok {
			r.p.Store(p)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		return p, stop, done
	}
	ra, rb := &readyAtReport{Metrics: eoskit.NopMetrics{}}, &readyAtReport{Metrics: eoskit.NopMetrics{}}
	var (
		pollMu sync.Mutex
		served []string // what the poller saw served unreported
	)
	poll := func(name string, r *readyAtReport) {
		for ctx.Err() == nil {
			if ps := r.unreported(); len(ps) > 0 {
				pollMu.Lock()
				served = append(served, fmt.Sprintf("%s %v", name, ps))
				pollMu.Unlock()
			}
			time.Sleep(time.Millisecond)
		}
	}
	a, stopA, doneA := start("a", ra)
	go poll("a", ra)
	waitCommitted(t, ctx, rr.adm, "reported", "reports")
	b, stopB, doneB := start("b", rb)
	go poll("b", rb)
	for (len(a.State().Partitions()) != 2 || len(b.State().Partitions()) != 2) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatalf("the two members did not split the four partitions: a holds %v, b %v", a.State().Partitions(), b.State().Partitions())
	}
	stopB()
	stopA()
	for _, done := range []chan error{doneA, doneB} {
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	for name, r := range map[string]*readyAtReport{"a": ra, "b": rb} {
		r.mu.Lock()
		if len(r.reported) == 0 {
			t.Errorf("%s reported no restore", name)
		}
		if len(r.early) > 0 {
			t.Errorf("%s served partitions %v before reporting their restore", name, r.early)
		}
		r.mu.Unlock()
	}
	pollMu.Lock()
	defer pollMu.Unlock()
	if len(served) > 0 {
		t.Errorf("served before their restore was reported: %v", served)
	}
}
