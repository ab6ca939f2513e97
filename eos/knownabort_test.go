package eos_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// knownAbort may call an unconfirmed commit aborted only from offsets that
// are stable. While a transaction's offset commit is pending (its markers
// not yet written), a plain offset fetch answers the last committed offset,
// older than the pending one, which would read as "aborted" though the
// pending commit may still commit: the processor would go on and copy the
// batch again. Read stable, the pending commit is visible as such, and the
// outcome stays unknown.
//
// A group that never committed is the sharper case: asked for all of a
// group's offsets, Kafka lists only partitions with a committed offset, so
// a pending first commit is simply missing from the answer.
func TestKnownAbortTrustsOnlyStableOffsets(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	// The control: offset 100 committed, nothing pending, a batch to 500:
	// aborted, and knownAbort must say so (a fetch that failed would not).
	commitOnly := func(t testing.TB, k *integration.KafkaCluster, _, group, in string, _ int64, _ time.Duration) {
		resp, err := k.Admin.CommitOffsets(t.Context(), group, kadm.OffsetsFromRecords(kgo.Record{Topic: in, Partition: 0, Offset: 99}))
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			t.Fatalf("commit offset 100: %v", err)
		}
	}
	for name, c := range map[string]struct {
		leave   func(t testing.TB, k *integration.KafkaCluster, txnID, group, in string, offset int64, timeout time.Duration)
		aborted bool
	}{
		"after a commit":   {testbed.LeaveOpenTransactionWithOffsets, false}, // offset 0 committed, 500 pending
		"the first commit": {testbed.LeaveOpenFirstCommit, false},            // nothing committed, 500 pending
		"nothing pending":  {commitOnly, true},                               // 100 committed: the batch to 500 aborted
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in := k.NewTopic(1)
			group := integration.UniqueName(t, "g")
			const pending = 500
			k.Seed(in, 2*pending)
			c.leave(t, k, integration.UniqueName(t, "txn"), group, in, pending, time.Minute)
			p, err := eos.NewProcessor(func(context.Context, *kgo.Record) ([]*kgo.Record, error) { return nil, nil },
				eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in), eos.TransactionalID(group+"-0"))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if got := p.KnownAbort(t.Context(), k.Client(), in, 0, pending); got != c.aborted {
				t.Fatalf("knownAbort = %v, want %v", got, c.aborted)
			}
			if took := time.Since(start); took > 35*time.Second {
				t.Fatalf("knownAbort took %s, past its deadline", took)
			}
		})
	}
}
