package eos_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
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
	t.Cleanup(seed.Close)
	var rs []*kgo.Record
	for p := range int32(partitions) {
		for i := range perPartition {
			v := make([]byte, 100)
			rand.Read(v)
			rs = append(rs, &kgo.Record{Partition: p, Key: fmt.Appendf(nil, "%d-%d", p, i), Value: v})
		}
	}
	if err := seed.ProduceSync(context.Background(), rs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

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
