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
	id, epoch := transact(ctx, t, cl, 3, kgo.TryCommit) // offsets 0-2, its commit marker 3
	_, later := transact(ctx, t, cl, 2, kgo.TryAbort)   // offsets 4-5, its abort marker 6
	adm := kadm.NewClient(cl)
	commit, found, err := MarkerAfter(ctx, adm, seeds, "out", 0, 0, id, epoch)
	if err != nil || !found || !commit {
		t.Fatalf("MarkerAfter from 0 with the records there: commit %v, found %v, %v; want the first transaction's commit", commit, found, err)
	}
	if later == epoch {
		t.Log("the producer kept its epoch across transactions (protocol v1): its later transaction's record cannot be told apart by the epoch")
	} else { // transaction protocol v2: an epoch per transaction
		// The second transaction's first record asked for as the
		// first's (a log truncated below 4 and written again by the
		// producer's later transaction): not its record.
		if commit, found, err := MarkerAfter(ctx, adm, seeds, "out", 0, 4, id, epoch); !errors.Is(err, ErrRecordsGone) {
			t.Fatalf("MarkerAfter from a record of the producer's later transaction: commit %v, found %v, %v; want ErrRecordsGone", commit, found, err)
		}
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
	commit, found, err = MarkerAfter(ctx, adm, seeds, "out", 0, 0, id, epoch)
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
	id, epoch := transact(ctx, t, cl, 2, kgo.TryCommit) // offsets 1 and 2, the commit marker 3
	adm := kadm.NewClient(cl)
	if commit, found, err := MarkerAfter(ctx, adm, seeds, "out", 0, 1, id, epoch); err != nil || !found || !commit {
		t.Fatalf("MarkerAfter from the transaction's first record: commit %v, found %v, %v; want its commit", commit, found, err)
	}
	if commit, found, err := MarkerAfter(ctx, adm, seeds, "out", 0, 0, id, epoch); !errors.Is(err, ErrRecordsGone) {
		t.Fatalf("MarkerAfter from another producer's record: commit %v, found %v, %v; want ErrRecordsGone", commit, found, err)
	}
	if commit, found, err := MarkerAfter(ctx, adm, seeds, "out", 0, 9, id, epoch); !errors.Is(err, ErrRecordsGone) {
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

// transact writes n records to "out" in one transaction of cl and ends it
// with end; it returns the producer id and epoch its records carry.
func transact(ctx context.Context, t *testing.T, cl *kgo.Client, n int, end kgo.TransactionEndTry) (int64, int16) {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	var id int64
	var epoch int16
	for i := range n {
		r, err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).First()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			id, epoch = r.ProducerID, r.ProducerEpoch
		}
	}
	if err := cl.EndTransaction(ctx, end); err != nil {
		t.Fatal(err)
	}
	return id, epoch
}
