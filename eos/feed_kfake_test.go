package eos_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// partitionsInFlight counts, per input partition, the handler calls under
// way, and the most partitions seen in a handler at once.
type partitionsInFlight struct {
	mu    sync.Mutex
	now   map[int32]int
	most  int
	calls int
}

func (f *partitionsInFlight) enter(p int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.now == nil {
		f.now = map[int32]int{}
	}
	f.now[p]++
	f.calls++
	f.most = max(f.most, len(f.now))
}

func (f *partitionsInFlight) leave(p int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.now[p]--; f.now[p] == 0 {
		delete(f.now, p)
	}
}

func (f *partitionsInFlight) read() (most, calls int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.most, f.calls
}

// With a backlog, PartitionOrder runs every partition's lane at once: the
// processor feeds lanes across polls, pausing a partition once its lane
// holds what it can handle before the commit, so that a poll, which
// franz-go fills partition by partition, no longer hands one partition's
// buffered thousands to one lane while the others wait. Four partitions of
// 6,000 records each, Concurrency(4, PartitionOrder), a 2 ms handler: all
// four partitions must be in the handler at once, early. (Before lanes
// were fed across polls, a poll of up to 4,000 records held one
// partition's: at most two partitions ever ran at once, one poll in three.)
func TestPartitionOrderRunsEveryPartitionAtOnceFromABacklog(t *testing.T) {
	const partitions, perPartition = 4, 6000
	brokers := backlog(t, partitions, perPartition, func(p int32, i int) *kgo.Record {
		v := make([]byte, 100)
		rand.Read(v)
		return &kgo.Record{Key: fmt.Appendf(nil, "%d-%d", p, i), Value: v}
	})

	var f partitionsInFlight
	handler := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		f.enter(r.Partition)
		defer f.leave(r.Partition)
		time.Sleep(2 * time.Millisecond)
		return []*kgo.Record{{Topic: "out", Key: r.Key, Value: r.Value}}, nil
	}
	txnID, _ := eos.StableTransactionalID("kfake-backlog", "0")
	p, err := eos.NewProcessor(handler, eos.Brokers(brokers...), eos.Group("kfake-backlog"), eos.Topics("in"),
		eos.TransactionalID(txnID), eos.Concurrency(partitions, eos.PartitionOrder), eos.HangingTransactionCheck(0), eos.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	// 2,000 calls take 4 s in one lane, 1 s in four.
	deadline := time.Now().Add(20 * time.Second)
	for {
		most, calls := f.read()
		if most == partitions {
			t.Logf("all %d partitions in the handler at once after %d calls", partitions, calls)
			break
		}
		if calls >= 2000 || time.Now().After(deadline) {
			t.Fatalf("after %d handler calls, at most %d of %d partitions were in the handler at once: lanes are not fed across polls", calls, most, partitions)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of its ctx's end")
	}
}

// A rebalance that takes partitions while lanes hold paused ones (every
// partition's lane is full from the backlog) loses nothing and leaves
// nothing paused: a second instance joins and leaves until a's log says
// a revoke found paused partitions, then a copies everything. Each
// output is checked: every input once (none lost, none twice), in offset
// order per input partition.
func TestARevokeOfPausedPartitionsLosesNothing(t *testing.T) {
	// A backlog of 6 s a lane (3 ms a record), for the joins and
	// leaves to strike while it lasts.
	const partitions, perPartition = 4, 2000
	brokers := backlog(t, partitions, perPartition, func(p int32, i int) *kgo.Record {
		return &kgo.Record{Value: fmt.Appendf(nil, "%d/%d", p, i)}
	})
	// The output names its input: partition/index, and the input's
	// partition as key, so that one output partition keeps its order.
	handler := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		time.Sleep(3 * time.Millisecond)
		return []*kgo.Record{{Topic: "out", Partition: r.Partition, Value: r.Value}}, nil
	}
	var logs integration.LogBuffer
	start := func(instance string, logger *slog.Logger) (stop func()) {
		txnID, _ := eos.StableTransactionalID("kfake-revoke", instance)
		p, err := eos.NewProcessor(handler, eos.Brokers(brokers...), eos.Group("kfake-revoke"), eos.Topics("in"),
			eos.TransactionalID(txnID), eos.Concurrency(partitions, eos.PartitionOrder), eos.HangingTransactionCheck(0), eos.Logger(logger),
			eos.ClientOptions(kgo.RecordPartitioner(kgo.ManualPartitioner())))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		return func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("processor %s: Run returned %v", instance, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("processor %s: Run did not return within 30 s of its ctx's end", instance)
			}
		}
	}
	stopA := start("a", slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	const said = "while lanes held paused ones"
	for try := 1; !strings.Contains(logs.String(), said); try++ {
		if try > 10 {
			t.Fatalf("ten joins and leaves of a second instance, and no revoke found a's lanes holding paused partitions")
		}
		time.Sleep(300 * time.Millisecond) // a's lanes fill up, and its partitions pause
		stopB := start("b", slog.New(slog.DiscardHandler))
		time.Sleep(500 * time.Millisecond)
		stopB()
	}

	reader, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("out"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)
	next := map[int32]int{}
	seen := 0
	deadline := time.Now().Add(60 * time.Second)
	for seen < partitions*perPartition {
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s, %d of %d outputs; per input partition, next expected %v", seen, partitions*perPartition, next)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := reader.PollFetches(ctx)
		cancel()
		for _, r := range fs.Records() {
			var p int32
			var i int
			if _, err := fmt.Sscanf(string(r.Value), "%d/%d", &p, &i); err != nil {
				t.Fatalf("output %q: %v", r.Value, err)
			}
			if i != next[p] {
				t.Fatalf("input partition %d: output %d where %d was next (lost, twice or out of order)", p, i, next[p])
			}
			next[p]++
			seen++
		}
	}
	stopA()
	t.Logf("every input once, in order; revokes that found paused partitions: %d", strings.Count(logs.String(), said))
}

// backlog starts a kfake cluster with topics "in" and "out" of partitions
// partitions, "in" holding perPartition records in each (record(p, i) is
// the i-th of partition p), and returns its brokers.
func backlog(t *testing.T, partitions int32, perPartition int, record func(p int32, i int) *kgo.Record) []string {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	seed, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("in"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	var rs []*kgo.Record
	for p := range partitions {
		for i := range perPartition {
			r := record(p, i)
			r.Partition = p
			rs = append(rs, r)
		}
	}
	if err := seed.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return brokers
}
