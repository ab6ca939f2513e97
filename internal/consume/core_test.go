package consume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/integration"
)

// These tests run the core on kfake: they check the pipelines' mechanics
// (which batch runs when, in what order, how often), not a guarantee,
// which offsetstore's and dedup's real-broker tests check.

// fakeTopic starts a kfake cluster with topic "in" of partitions
// partitions holding perPartition records each ("p/offset" values).
func fakeTopic(t *testing.T, partitions int32, perPartition int) []string {
	t.Helper()
	return fakeCluster(t, partitions, perPartition).ListenAddrs()
}

// fakeCluster is fakeTopic's cluster, for a test that controls requests.
func fakeCluster(t *testing.T, partitions int32, perPartition int) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	seed, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	var recs []*kgo.Record
	for p := range partitions {
		for o := range perPartition {
			recs = append(recs, &kgo.Record{Topic: "in", Partition: p, Value: fmt.Appendf(nil, "%d/%d", p, o)})
		}
	}
	if err := seed.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return c
}

// ledger records what a test's Commit committed, per partition, in order.
type ledger struct {
	mu        sync.Mutex
	next      map[int32]int64 // the next offset each partition must commit
	committed int
	errs      []error
}

func (l *ledger) commit(recs []*kgo.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.next == nil {
		l.next = map[int32]int64{}
	}
	for _, r := range recs {
		if r.Offset != l.next[r.Partition] {
			l.errs = append(l.errs, fmt.Errorf("partition %d committed offset %d, want %d", r.Partition, r.Offset, l.next[r.Partition]))
		}
		l.next[r.Partition] = r.Offset + 1
		l.committed++
	}
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.committed
}

func (l *ledger) check(t *testing.T, want int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 0 {
		t.Fatalf("out of order or twice: %v", errors.Join(l.errs...))
	}
	if l.committed != want {
		t.Fatalf("committed %d records, want %d", l.committed, want)
	}
}

func startCore(t *testing.T, brokers []string, concurrency, maxPoll int, run Runner) (stop func() error) {
	t.Helper()
	return startCoreWith(t, testConfig(brokers, concurrency, maxPoll), run)
}

// testConfig is startCore's configuration.
func testConfig(brokers []string, concurrency, maxPoll int) Config {
	cfg := Defaults()
	cfg.Brokers, cfg.Group, cfg.Topics = brokers, "g", []string{"in"}
	cfg.Concurrency, cfg.MaxPoll = concurrency, maxPoll
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.ClientOpts = []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(1 << 10)}
	return cfg
}

func startCoreWith(t *testing.T, cfg Config, run Runner) (stop func() error) {
	t.Helper()
	c, err := New("test", cfg, run)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err2 error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err2 = <-done:
			case <-time.After(30 * time.Second):
				err2 = errors.New("Run did not return within 30 s of its ctx's end")
			}
		})
		return err2
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30 s waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A partition whose batch stalls holds only itself: the other partitions'
// records all commit meanwhile, each partition in offset order, and the
// stalled one finishes once it is released.
func TestAStalledPartitionHoldsOnlyItself(t *testing.T) {
	const parts, per = 4, 200
	brokers := fakeTopic(t, parts, per)
	release := make(chan struct{})
	var l ledger
	stop := startCore(t, brokers, 4, 50, Runner{Commit: func(ctx context.Context, _ *kgo.Client, recs []*kgo.Record) error {
		if recs[0].Partition == 0 {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		l.commit(recs)
		return nil
	}})
	waitUntil(t, "the three other partitions to commit everything", func() bool { return l.count() == (parts-1)*per })
	close(release)
	waitUntil(t, "partition 0 to commit everything", func() bool { return l.count() == parts*per })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	l.check(t, parts*per)
}

// No more batches commit at once than Concurrency allows, and with more
// partitions than that, the bound is reached.
func TestConcurrencyBoundsBatchesAtOnce(t *testing.T) {
	const parts, per, bound = 6, 100, 3
	brokers := fakeTopic(t, parts, per)
	var now, most atomic.Int64
	var l ledger
	stop := startCore(t, brokers, bound, 20, Runner{Commit: func(ctx context.Context, _ *kgo.Client, recs []*kgo.Record) error {
		n := now.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		now.Add(-1)
		l.commit(recs)
		return nil
	}})
	waitUntil(t, "every record", func() bool { return l.count() == parts*per })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	l.check(t, parts*per)
	if m := most.Load(); m != bound {
		t.Fatalf("at most %d batches at once, want %d (the bound, reached)", m, bound)
	}
}

// A batch that fails goes to Failed, which moves the partition back; the
// batch queued behind it is dropped, not committed past the failed
// records, and everything commits once, in order.
func TestAFailedBatchIsFetchedAgainAndTheNextIsDropped(t *testing.T) {
	const parts, per = 2, 300
	brokers := fakeTopic(t, parts, per)
	refuse := errors.New("refused")
	var failures, dropped atomic.Int64
	var l ledger
	var mu sync.Mutex
	failAt := map[int64]bool{40: true, 150: true, 151: true} // partition 1's offsets whose batch fails once
	stop := startCore(t, brokers, 2, 20, Runner{
		Commit: func(ctx context.Context, _ *kgo.Client, recs []*kgo.Record) error {
			if recs[0].Partition == 1 {
				mu.Lock()
				for _, r := range recs {
					if failAt[r.Offset] {
						delete(failAt, r.Offset)
						mu.Unlock()
						return refuse
					}
				}
				mu.Unlock()
			}
			l.mu.Lock()
			if recs[0].Offset != l.next[recs[0].Partition] {
				dropped.Add(1) // would be a gap: must not happen
			}
			l.mu.Unlock()
			l.commit(recs)
			return nil
		},
		Failed: func(ctx context.Context, cl *kgo.Client, recs []*kgo.Record, err error) error {
			if !errors.Is(err, refuse) {
				return err
			}
			failures.Add(1)
			cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{"in": {recs[0].Partition: {Epoch: -1, Offset: recs[0].Offset}}})
			return nil
		},
	})
	waitUntil(t, "every record", func() bool { return l.count() == parts*per })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	l.check(t, parts*per)
	if f := failures.Load(); f != 3 {
		t.Fatalf("Failed ran %d times, want 3", f)
	}
	if d := dropped.Load(); d != 0 {
		t.Fatalf("%d batches would have committed past a gap", d)
	}
}

// A batch that fails for good ends Run with its error, once the other
// partitions' batches under way ended; nothing after it in its partition
// commits.
func TestAFailureForGoodEndsRun(t *testing.T) {
	const parts, per = 3, 200
	brokers := fakeTopic(t, parts, per)
	bad := errors.New("bad record")
	var l ledger
	cfg := Defaults()
	cfg.Brokers, cfg.Group, cfg.Topics, cfg.Concurrency, cfg.MaxPoll = brokers, "g", []string{"in"}, 3, 10
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.ClientOpts = []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(1 << 10)}
	c, err := New("test", cfg, Runner{Commit: func(ctx context.Context, _ *kgo.Client, recs []*kgo.Record) error {
		for _, r := range recs {
			if r.Partition == 2 && r.Offset == 55 {
				return bad
			}
		}
		l.commit(recs)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Run(ctx); !errors.Is(err, bad) {
		t.Fatalf("Run returned %v, want the batch's error", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if next := l.next[2]; next > 55 {
		t.Fatalf("partition 2 committed up to %d, past the failed record 55", next)
	}
	if len(l.errs) > 0 {
		t.Fatal(errors.Join(l.errs...))
	}
}

// Two cores share a group and commit to Kafka (CommitToKafka, as dedup
// does). When the second joins, the first's revoked partitions' batches
// (slow, their partitions paused) end and their offsets are committed
// before the revoke returns, so the second starts where they ended: every
// record commits once, in order, and both cores committed some.
func TestARevokeEndsThePartitionsBatchesAndCommitsThem(t *testing.T) {
	const parts, per = 4, 400
	brokers := fakeTopic(t, parts, per)
	var l ledger
	var byA, byB atomic.Int64
	runner := func(mine *atomic.Int64) Runner {
		return Runner{CommitToKafka: true, CommitWhat: "test commit", Commit: func(ctx context.Context, _ *kgo.Client, recs []*kgo.Record) error {
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			l.commit(recs)
			mine.Add(int64(len(recs)))
			return nil
		}}
	}
	stopA := startCore(t, brokers, 4, 20, runner(&byA))
	waitUntil(t, "a tenth of the records", func() bool { return l.count() > parts*per/10 })
	stopB := startCore(t, brokers, 4, 20, runner(&byB))
	waitUntil(t, "every record", func() bool { return l.count() >= parts*per })
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	l.check(t, parts*per)
	if byB.Load() == 0 {
		t.Fatalf("the second core committed nothing (the first %d): no partition moved", byA.Load())
	}
}

// New checks the client options by building a client, which it closes at
// once. That client must not join the group: a join, even a brief one,
// rebalances the group's running members and calls the caller's
// partition callbacks (given in ClientOpts) as if the runner had been
// assigned partitions. It was built with the group and its topics, so it
// started joining, and won the race with Close now and then.
func TestNewDoesNotJoinTheGroup(t *testing.T) {
	brokers := fakeTopic(t, 3, 0)
	var joins, assigned atomic.Int64
	hook := joinCounter{&joins}
	for range 100 {
		cfg := Defaults()
		cfg.Brokers, cfg.Group, cfg.Topics = brokers, "g", []string{"in"}
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg.ClientOpts = []kgo.Opt{kgo.WithHooks(hook),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
				assigned.Add(int64(len(parts["in"])))
			})}
		if _, err := New("test", cfg, Runner{Commit: func(context.Context, *kgo.Client, []*kgo.Record) error { return nil }}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	if joins.Load() > 0 || assigned.Load() > 0 {
		t.Fatalf("100 calls of New sent %d JoinGroup requests and called the caller's OnPartitionsAssigned for %d partitions; want none: only Run joins the group", joins.Load(), assigned.Load())
	}
}

// joinCounter counts the JoinGroup requests a client writes.
type joinCounter struct{ n *atomic.Int64 }

func (j joinCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	if kmsg.Key(key) == kmsg.JoinGroup || kmsg.Key(key) == kmsg.ConsumerGroupHeartbeat {
		j.n.Add(1)
	}
}

// A batch under way when the member's group session is lost (it stalled
// past its session timeout; here a heartbeat is answered
// UNKNOWN_MEMBER_ID) ends before the lost callback returns, and what it
// committed in the database has none of its offsets sent to Kafka: the
// partition is another member's by then, and an old commit must not move
// it back. The member says so in a warning naming the batch (dedup's new
// owner then skips its ids; offsetstore's is refused by the
// compare-and-set the late batch won).
func TestALostPartitionsBatchCommitsButNoneOfItsOffsets(t *testing.T) {
	c := fakeCluster(t, 1, 100)
	var sent atomic.Int64 // offsets committed to Kafka, for any partition
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		for _, tp := range req.(*kmsg.OffsetCommitRequest).Topics {
			sent.Add(int64(len(tp.Partitions)))
		}
		return nil, nil, false // observed only
	})
	var logs integration.LogBuffer
	lost := make(chan struct{}, 1)
	cfg := testConfig(c.ListenAddrs(), 2, 10)
	cfg.Drain = 0 // the rejoined member's batch waits for the end
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.ClientOpts = append(cfg.ClientOpts, kgo.HeartbeatInterval(100*time.Millisecond),
		kgo.OnPartitionsLost(func(context.Context, *kgo.Client, map[string][]int32) {
			select {
			case lost <- struct{}{}:
			default:
			}
		}))
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	startCoreWith(t, cfg, Runner{CommitToKafka: true, CommitWhat: "test commit", Commit: func(ctx context.Context, _ *kgo.Client, recs []*kgo.Record) error {
		if calls.Add(1) == 1 {
			close(entered)
			select {
			case <-release:
				return nil // committed, after the session was lost
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		<-ctx.Done() // the member that rejoined commits nothing
		return ctx.Err()
	}})
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out after 30 s waiting for the first batch")
	}
	refused := make(chan struct{})
	c.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		close(refused)
		return resp, nil, true
	})
	select {
	case <-refused:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out after 30 s waiting for a heartbeat")
	}
	// The lost callback gets to wait for the batch meanwhile. (Released
	// before it, the batch is settled as the member's and its offsets
	// are sent: the test fails, it cannot pass falsely.)
	time.Sleep(2 * time.Second)
	close(release)
	select {
	case <-lost:
	case <-time.After(30 * time.Second):
		t.Fatal("timed out after 30 s waiting for the session to be lost")
	}
	time.Sleep(3 * KafkaCommitInterval) // a commit of the batch would be due by now
	if n := sent.Load(); n > 0 {
		t.Errorf("%d offsets committed to Kafka; want none: the only batch that committed was of a partition the member had lost", n)
	}
	want := `msg="test: a batch of a partition taken from this member committed in the database, but the partition was lost`
	if out := logs.String(); !strings.Contains(out, want) || !strings.Contains(out, "partition=0 first_offset=0 records=10") {
		t.Errorf("no warning naming the batch committed after the session was lost (partition 0, offsets 0-9); logged:\n%s", out)
	}
}

// A batch that stops on a record (its Commit returns a *eoskit.RecordError)
// as Run's drain runs out still ends Run with that error: the operator
// must learn which record stopped the runner, not see a clean stop. Before,
// a failure that came once the drain had expired was dropped with the
// batches that rolled back, and Run returned nil (issue 43 item 16,
// failing on 3bfa998).
func TestAStopAsTheDrainRunsOutIsReturned(t *testing.T) {
	brokers := fakeTopic(t, 1, 20)
	cfg := testConfig(brokers, 1, 10)
	cfg.Drain = 200 * time.Millisecond
	started := make(chan struct{})
	var once sync.Once
	stop := startCoreWith(t, cfg, Runner{Commit: func(ctx context.Context, _ *kgo.Client, recs []*kgo.Record) error {
		for _, r := range recs {
			if r.Offset == 5 {
				once.Do(func() { close(started) })
				<-ctx.Done() // the drain ran out while the record was being stopped on
				return &eoskit.RecordError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Attempts: 1, Err: errors.New("bad record")}
			}
		}
		return nil
	}})
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the record was not reached within 30 s")
	}
	err := stop()
	if rerr, ok := errors.AsType[*eoskit.RecordError](err); !ok || rerr.Offset != 5 {
		t.Fatalf("Run = %v, want the *eoskit.RecordError of offset 5", err)
	}
}

// No batch starts once a batch failed for good: batches of other
// partitions waiting for a Concurrency slot when it fails are dropped
// (their records are read again by the next Run), not committed while Run
// is on its way out. Before, a waiting batch took the failed batch's slot
// at once, before the poll loop settled the failure (issue 43 item 16,
// failing on 411f3b1).
func TestNoBatchStartsAfterAFailureForGood(t *testing.T) {
	const parts, per = 6, 100
	brokers := fakeTopic(t, parts, per)
	bad := errors.New("bad record")
	var failed atomic.Bool
	var startedAfter atomic.Int32
	cfg := testConfig(brokers, 2, 10)
	c, err := New("test", cfg, Runner{Commit: func(ctx context.Context, _ *kgo.Client, recs []*kgo.Record) error {
		if failed.Load() {
			startedAfter.Add(1)
		}
		if recs[0].Partition == 0 && recs[0].Offset >= 20 {
			time.Sleep(50 * time.Millisecond) // the other partitions' batches queue for the slots
			failed.Store(true)
			return bad
		}
		time.Sleep(20 * time.Millisecond)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Run(ctx); !errors.Is(err, bad) {
		t.Fatalf("Run returned %v, want the batch's error", err)
	}
	if n := startedAfter.Load(); n > 0 {
		t.Fatalf("%d batches started after a batch failed for good", n)
	}
}
