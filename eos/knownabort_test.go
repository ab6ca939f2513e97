package eos_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
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
	for name, leave := range map[string]func(t testing.TB, txnID, group, in string, offset int64, timeout time.Duration){
		"after a commit":   k.LeaveOpenTransactionWithOffsets, // offset 0 committed, 500 pending
		"the first commit": k.LeaveOpenFirstCommit,            // nothing committed, 500 pending
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			in := k.NewTopic(1)
			group := integration.UniqueName(t, "g")
			const pending = 500
			k.Seed(in, 2*pending)
			leave(t, integration.UniqueName(t, "txn"), group, in, pending, time.Minute)
			p, err := eos.NewProcessor(func(context.Context, *kgo.Record) ([]*kgo.Record, error) { return nil, nil },
				eos.Brokers(k.Brokers...), eos.Group(group), eos.InputTopics(in), eos.TransactionalID(group+"-0"))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if p.KnownAbort(t.Context(), k.Client(), in, 0, pending) {
				t.Fatal("knownAbort called the batch aborted while the group's offset commit to its end is pending")
			}
			if took := time.Since(start); took > 35*time.Second {
				t.Fatalf("knownAbort took %s, past its deadline", took)
			}
		})
	}
}
