package eos

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
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
