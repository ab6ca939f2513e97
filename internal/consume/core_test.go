package consume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// These tests run the core on kfake: they check the pipelines' mechanics
// (which batch runs when, in what order, how often), not a guarantee,
// which offsetstore's and dedup's real-broker tests check.

// fakeTopic starts a kfake cluster with topic "in" of partitions
// partitions holding perPartition records each ("p/offset" values).
func fakeTopic(t *testing.T, partitions int32, perPartition int) []string {
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
	return c.ListenAddrs()
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
	cfg := Defaults()
	cfg.Brokers, cfg.Group, cfg.Topics = brokers, "g", []string{"in"}
	cfg.Concurrency, cfg.MaxPoll = concurrency, maxPoll
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.ClientOpts = []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxPartitionBytes(1 << 10)}
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
