package outbox_test

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// One database transaction of 30,000 records, one of them larger than
// its topic's max.message.bytes, with a DeadLetter topic, on a cluster of
// three (acks=all waits for a follower, as in production): finding the
// culprit must not outlive the Kafka transaction timeout (10 s here),
// nor start over with every new session. The relay publishes the 29,999
// others once, in order, and the big one as the one dead letter.
func TestIsolatingALargeTransactionFitsTheTransactionTimeout(t *testing.T) {
	cluster := testbed.StartLocalCluster(t)
	k := cluster.KafkaCluster
	pool, url := integration.PostgresWithURL(t)
	b := newBedOn(t, k, pool, url)
	small := newTopicWith(t, k, 3, "max.message.bytes", "20000")
	dlq := k.NewTopic(1)
	big := make([]byte, 30000)
	_, _ = crand.Read(big) // compression must not shrink it under the limit
	const n = 30000
	recs := make([]*kgo.Record, 0, n)
	for i := range n {
		v := []byte(strconv.Itoa(i))
		if i == n/2 {
			v = big
		}
		recs = append(recs, &kgo.Record{Topic: small, Key: []byte("k" + strconv.Itoa(i%50)), Value: v})
	}
	ctx := context.Background()
	// Every node knows the new topics before anything reads them.
	waitFor(t, 30*time.Second, "the topics on every node", func() bool {
		for range 3 {
			ends, err := k.Admin.ListEndOffsets(ctx, small, dlq)
			if err != nil || ends.Error() != nil {
				return false
			}
		}
		return true
	})
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, recs...) }); err != nil {
		t.Fatal(err)
	}

	// Batches within the topic's limit, so that only the big record is
	// refused, and a 10 s transaction timeout, which 30,000 produces each
	// waited for alone outlive.
	run := b.start(t, outbox.DeadLetter(dlq), outbox.RetryFor(90*time.Second),
		outbox.ClientOptions(kgo.TransactionTimeout(10*time.Second), kgo.ProducerBatchMaxBytes(16000)))
	deadline := time.Now().Add(150 * time.Second)
	for {
		dead := len(k.ReadNow(dlq, kgo.ReadCommitted(), time.Minute))
		published := len(k.ReadNow(small, kgo.ReadCommitted(), time.Minute))
		if dead >= 1 && published >= n-1 {
			break
		}
		select {
		case err := <-run.done:
			t.Fatalf("Run returned %v with %d of %d records published and %d dead letters", err, published, n-1, dead)
		case <-time.After(time.Second):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records published and %d dead letters after 150 s", published, n-1, dead)
		}
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if dl := k.ReadAll(dlq, kgo.ReadCommitted(), time.Minute); len(dl) != 1 {
		t.Fatalf("%d dead letters; want the big record once", len(dl))
	}
	got := k.ReadAll(small, kgo.ReadCommitted(), time.Minute)
	seen := make(map[int]bool, len(got))
	last := map[string]int{} // per key, the last index seen: commit (here write) order
	for _, r := range got {
		i, err := strconv.Atoi(string(r.Value))
		if err != nil || i == n/2 || seen[i] {
			t.Fatalf("record %q on %s: unexpected, or published twice", fmt.Sprintf("%.20s", r.Value), small)
		}
		seen[i] = true
		if prev, ok := last[string(r.Key)]; ok && prev > i {
			t.Fatalf("key %s: record %d after %d", r.Key, i, prev)
		}
		last[string(r.Key)] = i
	}
	if len(seen) != n-1 {
		t.Fatalf("%d records published; want %d once each", len(seen), n-1)
	}
	if rows := b.rows(t); rows != 0 {
		t.Fatalf("%d rows left in the outbox table", rows)
	}
}
