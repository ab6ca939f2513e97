package eos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/eoskit/eoskit"
)

func TestAbortedBeforeNeedsEveryPartitionStableAndBehind(t *testing.T) {
	a, b := topicPartition{"in", 0}, topicPartition{"in", 1}
	ends := map[topicPartition]int64{a: 500, b: 300}
	for _, c := range []struct {
		name    string
		fetched map[topicPartition]stableOffset
		want    bool
	}{
		{"both behind their ends: aborted", map[topicPartition]stableOffset{a: {0, nil}, b: {200, nil}}, true},
		{"never committed (-1) anywhere: aborted", map[topicPartition]stableOffset{a: {-1, nil}, b: {-1, nil}}, true},
		{"one at its end: committed", map[topicPartition]stableOffset{a: {500, nil}, b: {200, nil}}, false},
		{"one pending: unknown", map[topicPartition]stableOffset{a: {0, nil}, b: {0, kerr.UnstableOffsetCommit}}, false},
		{"one missing from the answer: unknown", map[topicPartition]stableOffset{a: {0, nil}}, false},
	} {
		if got := abortedBefore(ends, c.fetched); got != c.want {
			t.Errorf("%s: abortedBefore = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestDecideEndUnit(t *testing.T) {
	fenced := kerr.ProducerFenced
	timeout := 30 * time.Second
	for _, c := range []struct {
		name string
		end  txnEnd
		// timedOut and abortKnown are the broker's answers; nil: the
		// question must not be asked.
		timedOut, abortKnown *bool
		want                 endOutcome
	}{
		{name: "committed", end: txnEnd{wantCommit: true, committed: true},
			want: endOutcome{endCommitted, ""}},
		{name: "end refused for want of an ACL",
			end:  txnEnd{wantCommit: true, endErr: kerr.TransactionalIDAuthorizationFailed},
			want: endOutcome{endRefused, "refused"}},
		{name: "a state record refused for want of an ACL",
			end:  txnEnd{flushErr: &stateWriteError{topic: "counts", err: kerr.TopicAuthorizationFailed}},
			want: endOutcome{endRefused, "refused"}},
		{name: "a restore refused inside the transaction: not a state record, outcome unknown (a new session restores, and says so)",
			end:  txnEnd{flushErr: fmt.Errorf("restore: %w", kerr.TopicAuthorizationFailed)},
			want: endOutcome{endUnknown, "outcome-unknown"}},
		{name: "a state record refused by a fenced zombie: fenced", timedOut: ptr(false),
			end:  txnEnd{endErr: fenced, flushErr: &stateWriteError{topic: "counts", err: kerr.TopicAuthorizationFailed}, elapsed: 2 * timeout},
			want: endOutcome{endFenced, "fenced"}},
		{name: "a state record not written otherwise: outcome unknown",
			end:  txnEnd{flushErr: &stateWriteError{topic: "counts", err: kerr.RequestTimedOut}},
			want: endOutcome{endUnknown, "outcome-unknown"}},
		{name: "fenced within the timeout: the coordinator is not asked",
			end:  txnEnd{wantCommit: true, endErr: fenced, elapsed: timeout - time.Second},
			want: endOutcome{endFenced, "fenced"}},
		{name: "fenced past the timeout, timed out alone", timedOut: ptr(true),
			end:  txnEnd{wantCommit: true, endErr: fenced, elapsed: timeout},
			want: endOutcome{endTimedOut, "timeout"}},
		{name: "fenced past the timeout, the id has a new owner", timedOut: ptr(false),
			end:  txnEnd{wantCommit: true, endErr: fenced, elapsed: 2 * timeout},
			want: endOutcome{endFenced, "fenced"}},
		{name: "an output fenced past the timeout", timedOut: ptr(true),
			end:  txnEnd{produceErr: fenced, elapsed: 2 * timeout},
			want: endOutcome{endTimedOut, "timeout"}},
		{name: "the flush fenced", end: txnEnd{flushErr: fenced},
			want: endOutcome{endFenced, "fenced"}},
		{name: "End failed", end: txnEnd{wantCommit: true, endErr: kerr.UnknownServerError},
			want: endOutcome{endUnknown, "outcome-unknown"}},
		{name: "outputs unsettled", end: txnEnd{flushErr: context.DeadlineExceeded},
			want: endOutcome{endUnknown, "outcome-unknown"}},
		{name: "a plain batch's offset commit refused for want of an ACL: final, not a rebalance",
			end:  txnEnd{wantCommit: true, commitErr: kerr.GroupAuthorizationFailed},
			want: endOutcome{endRefused, "refused"}},
		{name: "a plain batch's offset commit refused for want of Read on the topic",
			end:  txnEnd{wantCommit: true, commitErr: kerr.TopicAuthorizationFailed},
			want: endOutcome{endRefused, "refused"}},
		{name: "a plain batch's offset commit refused as another process runs with this InstanceID: final",
			end:  txnEnd{wantCommit: true, commitErr: kerr.FencedInstanceID},
			want: endOutcome{endFenced, "fenced"}},
		{name: "a plain batch's offset commit failed otherwise: not counted as a rebalance",
			end:  txnEnd{wantCommit: true, commitErr: kerr.CoordinatorNotAvailable},
			want: endOutcome{endRebalanced, "commit-error"}},
		{name: "commit unconfirmed, no revoke, offsets show no abort", abortKnown: ptr(false),
			end:  txnEnd{wantCommit: true},
			want: endOutcome{endUnconfirmed, "outcome-unknown"}},
		{name: "commit unconfirmed, no revoke, offsets show the abort", abortKnown: ptr(true),
			end:  txnEnd{wantCommit: true},
			want: endOutcome{endRebalanced, "rebalance"}},
		{name: "commit unconfirmed after a revoke: the offsets are not read",
			end:  txnEnd{wantCommit: true, revoked: true},
			want: endOutcome{endRebalanced, "rebalance"}},
		{name: "shut down after the commit was asked for",
			end:  txnEnd{wantCommit: true, shutdown: true},
			want: endOutcome{endShutDown, "shutdown"}},
		{name: "shut down while a handler failed", end: txnEnd{shutdown: true, failed: true},
			want: endOutcome{endShutDown, "shutdown"}},
		{name: "a handler failed", end: txnEnd{failed: true, revoked: true},
			want: endOutcome{endBatchFailed, "handler-error"}},
		{name: "an output failed", end: txnEnd{produceErr: kerr.MessageTooLarge},
			want: endOutcome{endBatchFailed, "produce-error"}},
		{name: "out of budget", end: txnEnd{overBudget: true},
			want: endOutcome{endBatchFailed, "budget"}},
		{name: "a plain batch's commit refused by the group: known not to have happened, the offsets are not read",
			end:  txnEnd{wantCommit: true, commitErr: kerr.RebalanceInProgress},
			want: endOutcome{endRebalanced, "rebalance"}},
		{name: "a plain batch's commit failed as Run shut down", end: txnEnd{wantCommit: true, commitErr: kerr.RequestTimedOut, shutdown: true},
			want: endOutcome{endShutDown, "shutdown"}},
		{name: "a plain batch's output not acknowledged (endPlain makes it an output that failed)", end: txnEnd{produceErr: context.DeadlineExceeded},
			want: endOutcome{endBatchFailed, "produce-error"}},
		{name: "a setting no retry cures met inside the transaction (a partition the input gained)",
			end:  txnEnd{flushErr: &eoskit.ConfigError{Package: "eos", Setting: "Changelog", Reason: "grew"}},
			want: endOutcome{endConfig, "refused"}},
		{name: "not handled for no failure of its own (an isolated output unsettled)", end: txnEnd{},
			want: endOutcome{endBatchFailed, "rebalance"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := c.end
			e.timeout = timeout
			asked := map[string]int{}
			answer := func(q string, a *bool) func() bool {
				return func() bool {
					asked[q]++
					if a == nil {
						t.Errorf("%s was asked; its answer cannot change the outcome", q)
						return false
					}
					return *a
				}
			}
			e.timedOut, e.abortKnown = answer("timedOut", c.timedOut), answer("abortKnown", c.abortKnown)
			if got := decideEnd(e); got != c.want {
				t.Errorf("decideEnd = %+v, want %+v", got, c.want)
			}
			for q, n := range asked {
				if n > 1 {
					t.Errorf("%s asked %d times", q, n)
				}
			}
			if (c.timedOut != nil) != (asked["timedOut"] == 1) || (c.abortKnown != nil) != (asked["abortKnown"] == 1) {
				t.Errorf("asked %v; the answers given were needed: timedOut %v, abortKnown %v", asked, c.timedOut != nil, c.abortKnown != nil)
			}
		})
	}
}

func TestKnownOutcomeUnit(t *testing.T) {
	for _, c := range []struct {
		wantCommit, committed bool
		committedOut, known   bool
	}{
		{false, false, false, true}, // never asked to commit: it aborts
		{true, true, true, true},
		{true, false, false, false}, // may have committed at the broker
	} {
		committed, known := txnEnd{wantCommit: c.wantCommit, committed: c.committed}.knownOutcome()
		if committed != c.committedOut || known != c.known {
			t.Errorf("wantCommit %v, committed %v: knownOutcome = %v, %v, want %v, %v", c.wantCommit, c.committed, committed, known, c.committedOut, c.known)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// A plain batch's commit refused for good names what it needs, or says
// another process runs with the InstanceID.
func TestCommitRefusedNamesWhatTheCommitNeeds(t *testing.T) {
	var authErr *eoskit.AuthorizationError
	if err := commitRefused("g", kerr.GroupAuthorizationFailed); !errors.As(err, &authErr) || authErr.Permission != "Read on group g" {
		t.Errorf("group refused: %v", err)
	}
	if err := commitRefused("g", kerr.TopicAuthorizationFailed); !errors.As(err, &authErr) || !strings.Contains(authErr.Permission, "input topics") {
		t.Errorf("topic refused: %v", err)
	}
	if err := commitRefused("g", kerr.FencedInstanceID); !errors.Is(err, ErrFenced) || !errors.Is(err, kerr.FencedInstanceID) {
		t.Errorf("instance fenced: %v", err)
	}
}
