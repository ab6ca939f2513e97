package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// A relay of this very slot ran with another transactional id (the id,
// or its default derivation, changed across a deploy): its last batch
// committed (EndTxn returned), and it died before the markers were
// written, when the next relay, on the new id, reads its position. Here a
// transactional producer with another id writes what that relay would,
// the record and the position past it under the slot's key, and leaves
// the transaction open. The next relay must not take the older position
// and publish the record again: it waits for the marker and, the
// transaction committed, starts from the newer position. A transaction
// left open past the read's bound (a hanging one: KAFKA-20734 drops
// markers; the bound is a minute, 5 s here) fails the read with
// ErrPosition naming the partition and the producer; once it is aborted,
// the relay publishes the record, once.
func TestPositionReadWaitsForTheSlotsOpenTransactions(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	ctx := context.Background()
	b.writeEach(t, &kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte("1")})
	run := b.start(t)
	waitFor(t, time.Minute, "the first record", func() bool { return b.published(t) == 1 })
	if err := run.stop(); err != nil { // idle: no transaction open
		t.Fatal(err)
	}
	var sys, token string
	if err := b.pool.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sys); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(ctx, `SELECT token FROM eoskit_outbox_slots WHERE slot = $1`, b.slot).Scan(&token); err != nil {
		t.Fatal(err)
	}
	key := sys + "/" + b.slot

	// The relay on the old id: value's record on the output and the
	// position past its database transaction, in one transaction left
	// open.
	old := k.Client(kgo.TransactionalID(integration.UniqueName(t, "old-id")), kgo.TransactionTimeout(5*time.Minute))
	t.Cleanup(func() { _ = old.EndTransaction(context.Background(), kgo.TryAbort) })
	publishedByOld := func(value string) {
		t.Helper()
		b.writeEach(t, &kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte(value)})
		var wal string
		if err := b.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&wal); err != nil {
			t.Fatal(err)
		}
		if err := old.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		pos := &kgo.Record{Topic: b.positions, Key: []byte(key), Value: fmt.Appendf(nil, `{"lsn":%q,"key":%q,"token":%q}`, wal, key, token)}
		if err := old.ProduceSync(ctx, &kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte(value)}, pos).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// copies counts value's records on the output, open transactions'
	// included.
	copies := func(value string) int {
		n := 0
		for _, rec := range k.ReadNow(b.out, kgo.ReadUncommitted(), time.Minute) {
			if string(rec.Value) == value {
				n++
			}
		}
		return n
	}
	committed := func() string { return values(k.ReadNow(b.out, kgo.ReadCommitted(), time.Minute)) }

	// The marker comes while the relay reads.
	publishedByOld("2")
	run = b.start(t, outbox.RetryFor(time.Minute))
	for range 20 {
		if n := copies("2"); n != 1 {
			t.Fatalf("with the old id's transaction open: %d copies of record 2 on the output; want the old id's alone (the relay took the older position and published it again)", n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	commitAt := time.Now()
	if err := old.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	b.writeEach(t, &kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte("3")})
	waitFor(t, 30*time.Second, "record 3 committed", func() bool { return strings.Contains(committed(), "3") })
	if got := committed(); got != "1,2,3" {
		t.Fatalf("output %s; want 1,2,3", got)
	}
	// The read waited for the marker: it did not give up on the open
	// transaction and succeed on a retry after the commit.
	if h := run.relay.Health(); strings.Contains(h.LastError, "undecided") {
		t.Fatalf("the relay's read gave up on the old id's open transaction (%s) instead of waiting for its marker", h.LastError)
	}
	if h := run.relay.Health(); h.LastAssigned.After(commitAt) {
		t.Logf("the relay's read ended %s after the commit (it waited for the marker)", h.LastAssigned.Sub(commitAt).Round(time.Millisecond))
	} else {
		t.Logf("the relay's read ended %s before the commit", commitAt.Sub(h.LastAssigned).Round(time.Millisecond))
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	// The marker never comes.
	publishedByOld("4")
	id, _, err := old.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The read waits a minute by default; 5 s here.
	r, err := outbox.NewRelay(b.pool, b.opts(t, outbox.RetryFor(time.Second), outbox.MarkerWait(5*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	err, took := runFor(t, r, 3*time.Minute)
	want := []string{b.positions + "[0]", fmt.Sprintf("producer id %d", id), "undecided 5s after"}
	if !errors.Is(err, outbox.ErrPosition) || !strings.Contains(err.Error(), want[0]) || !strings.Contains(err.Error(), want[1]) || !strings.Contains(err.Error(), want[2]) {
		t.Fatalf("Run returned %v after %s; want ErrPosition naming %q, %q and %q", err, took.Round(time.Millisecond), want[0], want[1], want[2])
	}
	t.Logf("Run returned after %s: %v", took.Round(time.Millisecond), err)
	if n := copies("4"); n != 1 {
		t.Fatalf("%d copies of record 4 on the output; want the open transaction's alone", n)
	}
	if err := old.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	run = b.start(t)
	waitFor(t, time.Minute, "record 4 published by the relay", func() bool { return strings.Contains(committed(), "4") })
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if got := committed(); got != "1,2,3,4" {
		t.Fatalf("output %s; want 1,2,3,4 once each", got)
	}
}
