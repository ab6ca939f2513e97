package outbox_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// A large database transaction after a small one, whose read from the
// slot takes longer than the Kafka transaction timeout (a slow walsender,
// injected): the batch is read before its Kafka transaction begins, so
// the transaction holds only the produce. Before, the small one's Kafka
// transaction was open while the large one was read: it outlived its
// timeout, the session restarted on the same batch, and Run gave up at
// RetryFor with nothing published (issue 43 item 18, failing on a0c3743).
func TestALargeTransactionAfterASmallOneIsReadBeforeItsKafkaTransaction(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	ctx := context.Background()
	const large = 2000
	write := func(prefix string, n int) {
		recs := make([]*kgo.Record, n)
		for i := range recs {
			v := []byte(prefix + strconv.Itoa(i))
			recs[i] = &kgo.Record{Topic: b.out, Key: v, Value: v}
		}
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, recs...) }); err != nil {
			t.Fatal(err)
		}
	}
	write("small-", 1)
	write("large-", large)
	slowRead := outbox.ReadTxnHook(func(rows int) {
		if rows >= large {
			time.Sleep(13 * time.Second) // past the broker's sweep of timed-out transactions (every 10 s)
		}
	})
	run := b.start(t, slowRead, outbox.RetryFor(60*time.Second),
		outbox.ClientOptions(kgo.TransactionTimeout(5*time.Second)))
	deadline := time.Now().Add(2 * time.Minute)
	for b.published(t) < large+1 {
		select {
		case err := <-run.done:
			t.Fatalf("Run returned %v with %d of %d records published", err, b.published(t), large+1)
		case <-time.After(time.Second):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records published within 2 minutes", b.published(t), large+1)
		}
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range k.ReadAll(b.out, kgo.ReadCommitted(), time.Minute) {
		seen[string(r.Value)]++
	}
	if len(seen) != large+1 {
		t.Fatalf("%d distinct records published, want %d", len(seen), large+1)
	}
	for v, n := range seen {
		if n != 1 {
			t.Fatalf("%s published %d times", v, n)
		}
	}
}
