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
func TestKnownAbortTrustsOnlyStableOffsets(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in := k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	const pending = 500
	k.Seed(in, 2*pending)
	// Offset 0 committed, offset 500 pending in an open transaction.
	k.LeaveOpenTransactionWithOffsets(t, integration.UniqueName(t, "txn"), group, in, pending, time.Minute)
	p, err := eos.NewProcessor(func(context.Context, *kgo.Record) ([]*kgo.Record, error) { return nil, nil },
		eos.Brokers(k.Brokers...), eos.Group(group), eos.InputTopics(in), eos.TransactionalID(group+"-0"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if p.KnownAbort(t.Context(), k.Admin, in, 0, pending) {
		t.Fatal("knownAbort called the batch aborted while the group's offset commit to its end is pending")
	}
	if took := time.Since(start); took > 35*time.Second {
		t.Fatalf("knownAbort took %s, past its deadline", took)
	}
}
