package offsetstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/offsetstore"
)

// Under Kafka's consumer group protocol (KIP-848,
// offsetstore.ConsumerProtocol) on Kafka 4.4: three runners load 20,000
// records while one leaves mid-stream, another joins and a second leaves;
// the group is a consumer group (franz-go would fall back to the classic
// protocol silently), and the table holds every record once.
func TestExactlyOnceUnderTheConsumerProtocol(t *testing.T) {
	t.Parallel()
	const n = 20_000
	b := newBed(t, 6, n)
	loadRows := load(nil)
	h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		time.Sleep(time.Duration(len(recs)) * 200 * time.Microsecond) // paced, so that the churn lands mid-stream
		return loadRows(ctx, tx, recs)
	}
	start := func() *running {
		return b.start(t, h, offsetstore.ConsumerProtocol(), offsetstore.ClientOptions(kgo.FetchMaxPartitionBytes(16<<10)))
	}
	runs := map[string]*running{"a": start(), "b": start(), "c": start()}
	waitFor(t, time.Minute, "the group to be a consumer-protocol group with members", func() bool {
		described, err := b.k.Admin.DescribeConsumerGroups(t.Context(), b.group)
		return err == nil && described[b.group].Err == nil && len(described[b.group].Members) > 0
	})
	for _, step := range []struct {
		at          int
		leave, join string
	}{{n / 4, "b", "d"}, {n / 2, "a", ""}} {
		waitFor(t, 2*time.Minute, "the next milestone", func() bool { return b.rows(t) >= step.at })
		runs[step.leave].stop(t)
		if b.rows(t) >= n {
			t.Fatalf("%s left after every record was done: no churn mid-stream", step.leave)
		}
		delete(runs, step.leave)
		if step.join != "" {
			runs[step.join] = start()
		}
	}
	waitFor(t, 3*time.Minute, "every record loaded", func() bool { return b.rows(t) >= n })
	for _, r := range runs {
		r.stop(t)
	}
	t.Logf("verifier: %v", b.verify(t))
}
