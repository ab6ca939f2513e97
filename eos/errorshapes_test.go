package eos_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/contract"
)

// The handler error shapes every runner leaves to its error policy (the
// contract table offsetstore and dedup run too): each goes to the rule
// the policy gives it, the record dead-lettered in the transaction that
// commits its offset, every other input copied once.
func TestHandlerErrorShapesGoToThePolicy(t *testing.T) {
	t.Parallel()
	for _, shape := range contract.Shapes() {
		t.Run(shape.Name, func(t *testing.T) {
			t.Parallel()
			const n = 300
			k := integration.Kafka(t)
			in, out, dlt := k.NewTopic(2), k.NewTopic(2), k.NewTopic(1)
			inputs := k.Seed(in, n)
			bad := map[string]bool{}
			for i, id := range inputs {
				if i%40 == 7 {
					bad[id] = true
				}
			}
			var good []string
			for _, id := range inputs {
				if !bad[id] {
					good = append(good, id)
				}
			}
			h := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
				if bad[string(r.Key)] {
					return nil, shape.Err(r.Offset)
				}
				return copyHandler(out)(ctx, r)
			}
			progress := followCommitted(t, k, out)
			p := startProcessor(t, h, append(processorOpts(k, integration.UniqueName(t, "g"), in, "0"),
				eos.OnHandlerError(contract.Policy(eos.DeadLetter(dlt))), eos.MaxRecordsPerCommit(50))...)
			waitFor(t, time.Minute, "every good input copied", func() bool { return progress.n.Load() >= int64(len(good)) })
			if err := p.stop(t); err != nil {
				t.Fatalf("Run returned %v", err)
			}
			k.VerifyTopic(good, out, verifyTimeout)
			dead := map[string]int{}
			for _, r := range k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout) {
				dead[string(r.Key)]++
			}
			if fmt.Sprint(len(dead)) != fmt.Sprint(len(bad)) {
				t.Fatalf("dead-lettered %d inputs, want the %d bad ones", len(dead), len(bad))
			}
			for id, c := range dead {
				if !bad[id] || c != 1 {
					t.Fatalf("%s dead-lettered %d times (bad: %v), want each bad input once", id, c, bad[id])
				}
			}
		})
	}
}
