package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// Rows a relay published but could not delete (their transactions were
// decoded before other sessions could see them, as under a synchronous
// standby) and that relay then stopped: the next relay deletes them
// within seconds of its start, and publishes none of them again.
func TestPublishedRowsAStoppedRelayCouldNotDeleteAreSweptByTheNext(t *testing.T) {
	t.Parallel()
	b := newBed(t, integration.Kafka(t))
	if err := b.load.Write(context.Background(), 500, 4, 20); err != nil {
		t.Fatal(err)
	}
	committed := b.committed(t)
	var hidden atomic.Int64
	first := b.start(t, outbox.HideFromDeletion(func(int64) bool { hidden.Add(1); return true }))
	waitFor(t, time.Minute, "the first relay to publish every committed record", func() bool { return b.published(t) >= len(committed) })
	if err := first.stop(); err != nil {
		t.Fatalf("the first relay's Run returned %v after its context ended; want nil", err)
	}
	if n := b.rows(t); n != len(committed) || hidden.Load() == 0 {
		t.Fatalf("%d rows left by the first relay (%d deletions hidden); want all %d", n, hidden.Load(), len(committed))
	}

	second := b.start(t)
	deadline := 30 * time.Second
	began := time.Now()
	for b.rows(t) > 0 {
		if time.Since(began) > deadline {
			t.Fatalf("%d of %d published rows still in the outbox table %s after the next relay started", b.rows(t), len(committed), deadline)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the next relay emptied the table %s after its start", time.Since(began).Round(time.Millisecond))
	// A new record still goes through, and nothing went twice.
	if err := b.load.Write(context.Background(), 10, 1, 5); err != nil {
		t.Fatal(err)
	}
	committed = b.committed(t)
	waitFor(t, time.Minute, "the new records", func() bool { return b.published(t) >= len(committed) })
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}
	rep := b.verify(t)
	if rep.Outputs != len(committed) {
		t.Fatalf("%d outputs; want the %d committed records once each", rep.Outputs, len(committed))
	}
	if n := b.rows(t); n != 0 {
		t.Fatalf("%d rows left in the outbox table", n)
	}
}
