package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// An outbox record addressed as a relay's position (to this relay's
// position topic, or keyed "<system id>/<slot>" as another service's
// position record is) is never published: it could move that relay's
// position on its next start. Without a dead-letter topic it stops the
// relay with a *RecordError wrapping ErrPositionRecord; with one, both are
// dead-lettered and the records around them published. Before, another
// service's writer could forge a relay's position (issue 43 item 20,
// failing on 3bfa998: both were published).
func TestARecordAddressedAsAPositionIsNeverPublished(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	ctx := context.Background()
	var system string
	if err := b.pool.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&system); err != nil {
		t.Fatal(err)
	}
	other := k.NewTopic(1)
	b.writeEach(t,
		&kgo.Record{Topic: other, Key: []byte("k"), Value: []byte("before")},
		&kgo.Record{Topic: b.positions, Key: []byte("anything"), Value: []byte("forged into the position topic")},
		&kgo.Record{Topic: other, Key: []byte(system + "/another-service"), Value: []byte("forged as a position elsewhere")},
		&kgo.Record{Topic: other, Key: []byte("k"), Value: []byte("after")},
	)
	forged := b.idOf(t, "forged into the position topic")

	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	r, err := outbox.NewRelay(b.pool, b.opts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(rctx)
	if rerr, ok := errors.AsType[*outbox.RecordError](err); !ok || rerr.ID != forged || !errors.Is(err, outbox.ErrPositionRecord) {
		t.Fatalf("Run = %v, want a *RecordError for record %d wrapping ErrPositionRecord", err, forged)
	}

	dlq := k.NewTopic(1)
	run := b.start(t, outbox.DeadLetter(dlq))
	waitFor(t, time.Minute, "both forged records dead-lettered", func() bool { return len(k.ReadNow(dlq, kgo.ReadCommitted(), time.Minute)) == 2 })
	waitFor(t, time.Minute, "the records around them", func() bool { return len(k.ReadNow(other, kgo.ReadCommitted(), time.Minute)) == 2 })
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	// Their dead letters name no topic to replay them to: a replay must
	// choose one, and cannot send them back as positions unasked.
	for _, rec := range k.ReadAll(dlq, kgo.ReadCommitted(), time.Minute) {
		for _, h := range rec.Headers {
			if h.Key == "eoskit-outbox-topic" {
				t.Fatalf("the dead letter of a record addressed as a position names topic %q", h.Value)
			}
		}
	}
	for _, rec := range k.ReadAll(other, kgo.ReadCommitted(), time.Minute) {
		if v := string(rec.Value); v != "before" && v != "after" {
			t.Fatalf("%q was published to %s", v, other)
		}
	}
	for _, rec := range k.ReadAll(b.positions, kgo.ReadUncommitted(), time.Minute) {
		if string(rec.Value) == "forged into the position topic" {
			t.Fatal("the forged record reached the position topic")
		}
	}
}
