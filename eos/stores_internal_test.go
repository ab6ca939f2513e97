package eos

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/changelog"
	"github.com/eoskit/eoskit/state"
)

// A refused state record is the transaction's failure even when a sibling
// record failed first for another reason (a refused partition's siblings
// fail OPERATION_NOT_ATTEMPTED): Run must name the ACL, not restart.
func TestARefusedStateRecordIsTheFailureThatCounts(t *testing.T) {
	ks := newKeyedState(&stateConfig{changelog: "counts"}, "in", slog.New(slog.DiscardHandler))
	ks.fail(&stateWriteError{topic: "counts", partition: 1, err: kerr.OperationNotAttempted})
	ks.fail(&stateWriteError{topic: "counts", partition: 0, err: kerr.TopicAuthorizationFailed})
	ks.fail(&stateWriteError{topic: "counts", partition: 2, err: kerr.RequestTimedOut})
	err := ks.takeErr()
	if sw := refusedStateWrite(err); sw == nil || sw.partition != 0 {
		t.Fatalf("the transaction's failure is %v, want the refused record of partition 0", err)
	}
	ks.fail(&stateWriteError{topic: "counts", partition: 1, err: kerr.InvalidProducerEpoch})
	ks.fail(&stateWriteError{topic: "counts", partition: 0, err: kerr.TopicAuthorizationFailed})
	if err := ks.takeErr(); !isFenced(err) {
		t.Fatalf("the transaction's failure is %v, want the fencing (a zombie is told it is one)", err)
	}
	ks.fail(errors.New("restore failed"))
	ks.fail(&stateWriteError{topic: "counts", partition: 2, err: kerr.RequestTimedOut})
	if err := ks.takeErr(); err == nil || err.Error() != "restore failed" {
		t.Fatalf("the transaction's failure is %v, want the first (no refusal among them)", err)
	}
}

// An assignment that gives the input nothing (a cooperative rebalance's
// for a member that keeps what it had, or one of another topic) leaves
// the transaction in flight alone: only partitions to restore end it
// early (issue 43 item 6).
func TestAnEmptyAssignmentLeavesTheTransactionInFlight(t *testing.T) {
	ks := newKeyedState(&stateConfig{changelog: "counts"}, "in", slog.New(slog.DiscardHandler))
	since := ks.assignments.Load()
	ks.assigned(nil, nil)
	ks.assigned(nil, []int32{})
	if ks.moreAssigned(since) {
		t.Fatal("an empty assignment ends the transaction in flight early")
	}
	ks.assigned(nil, []int32{3})
	if !ks.moreAssigned(since) {
		t.Fatal("a partition assigned does not end the transaction in flight, which must restore it first")
	}
}

// A partition assigned again while its store is still open (records of
// it were polled) is restored again on that store, which another owner
// may have written meanwhile: its remembered stream time and window bound
// are forgotten (when the restore's jobs are adopted, once the lanes are
// quiet), so that its next record reads the restored ones.
func TestARestoreForgetsThePartitionsStreamTime(t *testing.T) {
	ks := newKeyedState(&stateConfig{changelog: "counts"}, "in", slog.New(slog.DiscardHandler))
	store := state.NewMemory()
	ps := &partState{store: store, txn: state.NewTxn(store, 0)}
	ps.clock.at.Store(1_700_000_000_002)
	ps.clock.earliest.Store(boundOf(time.UnixMilli(1_700_000_000_000)))
	ks.parts[3] = ps
	ks.restore[3] = true // as assigned() marks it
	todo, err := ks.openForRestore([]int32{3}, []int32{3})
	if err != nil || len(todo) != 1 || todo[0].ps != ps {
		t.Fatalf("openForRestore: %v, %v; want the open store restored again", todo, err)
	}
	ks.adopt(todo) // as prepare does, after quiescing the lanes
	if at, earliest := ps.clock.at.Load(), ps.clock.earliest.Load(); at != 0 || earliest != 0 {
		t.Fatalf("the partition's memo holds stream time %d and window bound %d through its restore, want both forgotten", at, earliest)
	}
}

// restoringAgain returns a keyed state on a kfake changelog whose
// partition 3, its store still open, was assigned again, the store's
// partState, and a poll of a record of partition 3: prepare then restores
// it in the transaction's way (restoreAll).
func restoringAgain(t *testing.T) (*keyedState, *partState, kgo.Fetches) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "counts"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	ks := newKeyedState(&stateConfig{changelog: "counts", restoreTimeout: time.Minute}, "in", slog.New(slog.DiscardHandler))
	if err := ks.open([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ks.close)
	ks.partitions.Store(4)
	store := state.NewMemory()
	ps := &partState{store: store, txn: state.NewTxn(store, 0)}
	ps.last.Store(-1)
	ks.parts[3] = ps
	ks.restore[3] = true // assigned again, its store still open
	polled := kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: "in", Partitions: []kgo.FetchPartition{
		{Partition: 3, Records: []*kgo.Record{{Topic: "in", Partition: 3}}}}}}}}
	return ks, ps, polled
}

// prepare quiets the lanes before it adopts the stores it restores, which
// forgets their memos: a lane's call kept while the lanes wind down (here,
// inside quiesce) remembers the store as it was before its restore, and
// must not outlive it. It fails with adopt moved before quiesce.
func TestPrepareQuietsTheLanesBeforeItForgetsTheMemos(t *testing.T) {
	ks, ps, polled := restoringAgain(t)
	quieted := false
	quiesce := func() {
		quieted = true
		// The last lane's call is kept as the lanes wind down.
		ps.clock.at.Store(1_700_000_000_002)
		ps.clock.earliest.Store(boundOf(time.UnixMilli(1_700_000_000_000)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ks.prepare(ctx, polled, true, quiesce); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	if !quieted {
		t.Fatal("prepare restored the partition's store without quieting the lanes")
	}
	if at, earliest := ps.clock.at.Load(), ps.clock.earliest.Load(); at != 0 || earliest != 0 {
		t.Fatalf("after the restore the memo holds stream time %d and window bound %d from a call kept before it, want both forgotten", at, earliest)
	}
}

// A restore in the transaction's way (restoreAll) is reported while its
// partition is still marked restoring, and unmarked after: whoever sees
// the partition served finds its restore among the reports (as
// TestARestoreIsReportedBeforeItsPartitionIsReadable checks of the
// background restores).
func TestRestoreAllReportsBeforeItUnmarks(t *testing.T) {
	ks, _, polled := restoringAgain(t)
	reports := 0
	ks.restored = func(p int32, _ changelog.Result) {
		reports++
		ks.mu.RLock()
		defer ks.mu.RUnlock()
		if p != 3 || !ks.restoring[p] {
			t.Errorf("partition %d reported restored while marked restoring %v, want partition 3 still marked", p, ks.restoring[p])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ks.prepare(ctx, polled, true, nil); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	ks.mu.RLock()
	restoring := ks.restoring[3]
	ks.mu.RUnlock()
	if reports != 1 || restoring {
		t.Fatalf("%d reports, partition 3 marked restoring %v after prepare; want 1 report, and the mark gone", reports, restoring)
	}
}
