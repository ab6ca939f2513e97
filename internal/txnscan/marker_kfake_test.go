package txnscan

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A transaction committed, then one of the same producer aborted; the
// first one's records and marker deleted (retention, DeleteRecords, a
// purged repartition topic). MarkerAfter from the first transaction's
// offset reads its commit while the records are there, and then says the
// marker is gone (ErrRecordsGone), never the later transaction's abort.
// Before, a read from a deleted offset restarted at the log's start and
// returned that abort: a committed transaction judged aborted.
func TestMarkerAfterDeletedRecordsIsNotAnotherTransactions(t *testing.T) {
	seeds, ctx := outTopic(t)
	cl, err := kgo.NewClient(append(seeds, kgo.TransactionalID("p"), kgo.DefaultProduceTopic("out"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	txn := func(n int, commit kgo.TransactionEndTry) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for range n {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	txn(3, kgo.TryCommit) // offsets 0-2, its commit marker 3
	txn(2, kgo.TryAbort)  // offsets 4-5, its abort marker 6
	id, _, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	commit, found, err := MarkerAfter(ctx, adm, seeds, "out", 0, 0, id)
	if err != nil || !found || !commit {
		t.Fatalf("MarkerAfter from 0 with the records there: commit %v, found %v, %v; want the first transaction's commit", commit, found, err)
	}
	var to kadm.Offsets
	to.Add(kadm.Offset{Topic: "out", Partition: 0, At: 4, LeaderEpoch: -1})
	deleted, err := adm.DeleteRecords(ctx, to)
	if err != nil {
		t.Fatal(err)
	}
	if err := deleted.Error(); err != nil {
		t.Fatal(err)
	}
	commit, found, err = MarkerAfter(ctx, adm, seeds, "out", 0, 0, id)
	if !errors.Is(err, ErrRecordsGone) {
		t.Fatalf("MarkerAfter from 0 once 0 to 3 were deleted: commit %v, found %v, %v; want ErrRecordsGone, not the later transaction's abort", commit, found, err)
	}
}

// The record at from must be the transaction's first: a record of
// another producer there (a log truncated and written again, compacted,
// or a caller's wrong offset) and a log that ends at or before from give
// ErrRecordsGone, not the producer's next marker.
func TestMarkerAfterNeedsTheTransactionsFirstRecordAtFrom(t *testing.T) {
	seeds, ctx := outTopic(t)
	other, err := kgo.NewClient(append(seeds, kgo.DefaultProduceTopic("out"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.ProduceSync(ctx, &kgo.Record{Value: []byte("another producer's")}).FirstErr(); err != nil { // offset 0
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(seeds, kgo.TransactionalID("p"), kgo.DefaultProduceTopic("out"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // offsets 1 and 2, the commit marker 3
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	id, _, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	if commit, found, err := MarkerAfter(ctx, adm, seeds, "out", 0, 1, id); err != nil || !found || !commit {
		t.Fatalf("MarkerAfter from the transaction's first record: commit %v, found %v, %v; want its commit", commit, found, err)
	}
	if commit, found, err := MarkerAfter(ctx, adm, seeds, "out", 0, 0, id); !errors.Is(err, ErrRecordsGone) {
		t.Fatalf("MarkerAfter from another producer's record: commit %v, found %v, %v; want ErrRecordsGone", commit, found, err)
	}
	if commit, found, err := MarkerAfter(ctx, adm, seeds, "out", 0, 9, id); !errors.Is(err, ErrRecordsGone) {
		t.Fatalf("MarkerAfter from past the log's end: commit %v, found %v, %v; want ErrRecordsGone", commit, found, err)
	}
}

// outTopic starts a kfake cluster with a topic "out" of one partition, for
// the test's length, and returns its seed brokers and a context that ends
// within 30 s.
func outTopic(t *testing.T) ([]kgo.Opt, context.Context) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, ctx
}
