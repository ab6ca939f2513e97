package outbox_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
)

// A table of the outbox's name in another schema, added to the outbox's
// publication (by a DBA's mistake, or a second application), is not the
// outbox: its rows are never published, and the outbox's own rows after
// it all are. Before, the stream matched the table by name alone: the
// other table's Relation message took the outbox's place, its row was
// published, and the outbox's rows after it were dropped (issue 43 item
// 23, failing on 411f3b1).
func TestATableOfTheSameNameInAnotherSchemaIsNotTheOutbox(t *testing.T) {
	t.Parallel()
	b := newBed(t, integration.Kafka(t))
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE SCHEMA other;
		CREATE TABLE other.eoskit_outbox (LIKE public.eoskit_outbox INCLUDING ALL);
		ALTER PUBLICATION eoskit_outbox ADD TABLE other.eoskit_outbox`); err != nil {
		t.Fatal(err)
	}
	run := b.start(t)
	b.writeEach(t, &kgo.Record{Topic: b.out, Value: []byte("first")})
	waitFor(t, time.Minute, "the first record published", func() bool { return b.published(t) >= 1 })
	if _, err := b.pool.Exec(ctx, `INSERT INTO other.eoskit_outbox (topic, value) VALUES ($1, 'foreign')`, b.out); err != nil {
		t.Fatal(err)
	}
	b.writeEach(t, &kgo.Record{Topic: b.out, Value: []byte("second")}, &kgo.Record{Topic: b.out, Value: []byte("third")})
	want := []string{"first", "second", "third"}
	var got []string
	ok := false
	for deadline := time.Now().Add(30 * time.Second); !ok && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		got = got[:0]
		for _, r := range b.k.ReadNow(b.out, kgo.ReadCommitted(), time.Minute) {
			got = append(got, string(r.Value))
		}
		slices.Sort(got)
		ok = slices.Equal(got, want)
	}
	if err := run.stop(); err != nil {
		t.Fatalf("Run returned %v", err)
	}
	if !ok {
		t.Fatalf("published %q, want %q", got, want)
	}
}
