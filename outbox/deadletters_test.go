package outbox_test

import (
	"context"
	crand "crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// A record Kafka refused as its own fault is kept whole in the outbox's
// dead-letter table; ListDeadLetters shows it, and once its cause is
// mended, ReplayDeadLetters moves it back into the outbox, whose relay
// publishes it once, leaving the table empty. Before, only a hand-written
// SQL statement could (issue 47 item 15).
func TestOutboxDeadLettersAreListedAndReplayedOnce(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	ctx := context.Background()
	small := newTopicWith(t, k, 1, "max.message.bytes", "20000")
	dlq := k.NewTopic(1)
	big := make([]byte, 30000)
	_, _ = crand.Read(big) // compression must not shrink it under the limit
	var recs []*kgo.Record
	for i := range 10 {
		v := []byte("v" + strconv.Itoa(i))
		if i == 5 {
			v = big
		}
		recs = append(recs, &kgo.Record{Topic: small, Key: []byte("k" + strconv.Itoa(i)), Value: v})
	}
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, recs...) }); err != nil {
		t.Fatal(err)
	}
	run := b.start(t, outbox.DeadLetter(dlq))
	waitFor(t, time.Minute, "the 9 small records published and the big one kept", func() bool {
		kept, err := outbox.ListDeadLetters(ctx, b.pool, 10, nil)
		return err == nil && len(kept) == 1 && len(k.ReadNow(small, kgo.ReadCommitted(), 10*time.Second)) == 9
	})
	kept, err := outbox.ListDeadLetters(ctx, b.pool, 10, nil)
	if err != nil || len(kept) != 1 || kept[0].Topic != small || string(kept[0].Key) != "k5" || len(kept[0].Value) != len(big) || kept[0].Error == "" {
		t.Fatalf("ListDeadLetters = %+v, %v; want the big record, whole, with why", kept, err)
	}
	// Mended: the topic takes it now.
	limit := "100000"
	if _, err := k.Admin.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &limit}}, small); err != nil {
		t.Fatal(err)
	}
	if n, err := outbox.ReplayDeadLetters(ctx, b.pool, nil, ""); err != nil || n != 1 {
		t.Fatalf("ReplayDeadLetters = %d, %v; want 1", n, err)
	}
	waitFor(t, time.Minute, "the replayed record published", func() bool {
		return len(k.ReadNow(small, kgo.ReadCommitted(), 10*time.Second)) == 10
	})
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if left, err := outbox.ListDeadLetters(ctx, b.pool, 10, nil); err != nil || len(left) != 0 {
		t.Fatalf("the dead-letter table after the replay: %d rows, %v; want none", len(left), err)
	}
	seen := map[string]int{}
	for _, r := range k.ReadAll(small, kgo.ReadCommitted(), time.Minute) {
		seen[string(r.Key)]++
	}
	for i := range 10 {
		if seen["k"+strconv.Itoa(i)] != 1 {
			t.Fatalf("k%d published %d times, want once", i, seen["k"+strconv.Itoa(i)])
		}
	}
}
