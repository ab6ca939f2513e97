package outbox_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// Six writers commit 6,000 records over 50 keys with ids that commit out
// of order and one transaction in ten rolled back: every committed record
// reaches Kafka once, per key in commit order, no rolled-back one does,
// and the outbox table is emptied.
func TestRelayPublishesEachCommittedRecordOnceInCommitOrder(t *testing.T) {
	t.Parallel()
	b := newBed(t, integration.Kafka(t))
	run := b.start(t)
	if err := b.load.Write(context.Background(), 6000, 6, 50); err != nil {
		t.Fatal(err)
	}
	committed := b.committed(t)
	waitFor(t, 2*time.Minute, "every committed record on the output", func() bool { return b.published(t) >= len(committed) })
	if err := run.stop(); err != nil {
		t.Fatalf("Run returned %v after its context ended; want nil", err)
	}
	rep := b.verify(t)
	in, err := b.load.Inputs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outputs != 6000 || len(in.Aborted) == 0 {
		t.Fatalf("outputs %d, rolled back %d: want 6000 outputs and some rollbacks", rep.Outputs, len(in.Aborted))
	}
	if n := b.rows(t); n != 0 {
		t.Fatalf("%d rows left in the outbox table after everything was published", n)
	}
	t.Logf("verifier: %v", rep)
}

// Write keeps what a record carries: a nil key apart from an empty one,
// a nil value, headers with nil and empty values, and a chosen partition;
// the Kafka timestamp is the database commit's time.
func TestWriteKeepsWhatARecordCarries(t *testing.T) {
	t.Parallel()
	b := newBed(t, integration.Kafka(t))
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if err := outbox.Write(ctx, tx,
			&kgo.Record{Topic: b.out, Key: nil, Value: []byte("nil key")},
			&kgo.Record{Topic: b.out, Key: []byte{}, Value: nil},
			&kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte{0, 0xff, '\\', 'x'}, Headers: []kgo.RecordHeader{
				{Key: "a", Value: nil}, {Key: "b", Value: []byte{}}, {Key: "", Value: []byte("c")}}},
		); err != nil {
			return err
		}
		return outbox.WriteToPartition(ctx, tx, 5, &kgo.Record{Topic: b.out, Key: []byte("pinned"), Value: []byte("to 5")})
	})
	if err != nil {
		t.Fatal(err)
	}
	run := b.start(t)
	waitFor(t, time.Minute, "4 records", func() bool { return b.published(t) >= 4 })
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	recs := b.k.ReadAll(b.out, kgo.ReadCommitted(), time.Minute)
	byValue := map[string]*kgo.Record{}
	for _, r := range recs {
		byValue[string(r.Value)] = r
		if r.Timestamp.Before(before) || r.Timestamp.After(time.Now()) {
			t.Errorf("record %q has timestamp %v, not its commit's time", r.Value, r.Timestamp)
		}
	}
	if r := byValue["nil key"]; r == nil || r.Key != nil {
		t.Errorf("nil key: got %+v", r)
	}
	if r := byValue[""]; r == nil || r.Key == nil || len(r.Key) != 0 || r.Value != nil {
		t.Errorf("empty key, nil value: got %+v", r)
	}
	r := byValue[string([]byte{0, 0xff, '\\', 'x'})]
	if r == nil || len(r.Headers) != 3 || r.Headers[0].Key != "a" || r.Headers[0].Value != nil ||
		r.Headers[1].Value == nil || len(r.Headers[1].Value) != 0 || r.Headers[2].Key != "" || !bytes.Equal(r.Headers[2].Value, []byte("c")) {
		t.Errorf("binary value with headers: got %+v", r)
	}
	if r := byValue["to 5"]; r == nil || r.Partition != 5 {
		t.Errorf("WriteToPartition(5): got %+v", r)
	}
}

// A relay refuses to start, with an error saying what to do, on a
// database that was not migrated or a slot that does not exist.
func TestRelayRefusesWhatItCanNotRelay(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	pool := integration.Postgres(t)
	ctx := context.Background()
	r, err := outbox.NewRelay(pool, outbox.Brokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, outbox.ErrSchema) {
		t.Fatalf("Run on a database never migrated returned %v; want ErrSchema", err)
	}
	b := newBedOn(t, k, pool, "")
	r, err = outbox.NewRelay(pool, b.opts(t, outbox.Slot("no_such_slot"))...)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, outbox.ErrNoSlot) {
		t.Fatalf("Run on a missing slot returned %v; want ErrNoSlot", err)
	}
	// A slot created with two_phase would stream prepared transactions
	// before they commit: refused at the start (issue 43 item 23; on
	// 3bfa998 it was taken, and failed at the first PREPARE).
	twoPhase := fmt.Sprintf("two_phase_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, true)`, twoPhase); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, twoPhase) })
	r, err = outbox.NewRelay(pool, b.opts(t, outbox.Slot(twoPhase))...)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, outbox.ErrNoSlot) || !strings.Contains(err.Error(), "two_phase") {
		t.Fatalf("Run on a two_phase slot returned %v; want ErrNoSlot naming two_phase", err)
	}
	for _, o := range []outbox.Option{outbox.Slot("Bad-Name"), outbox.WithSemantics(eos.AtMostOnce), outbox.CommitInterval(0),
		// A dead letter there would be read as a relay's position.
		outbox.DeadLetter(outbox.DefaultPositionTopic),
		// Refused by the constructor, not once Run holds the slot.
		outbox.ClientOptions(kgo.RequiredAcks(kgo.LeaderAck())),
		// Measured from the commit time the relay stamps: a backlog would
		// all time out (issue 47 item 14; taken on 411f3b1).
		outbox.ClientOptions(kgo.RecordDeliveryTimeout(time.Minute))} {
		_, err := outbox.NewRelay(pool, outbox.Brokers(k.Brokers...), o)
		if cerr, ok := errors.AsType[*eoskit.ConfigError](err); !ok || cerr.Package != "outbox" || !errors.Is(err, eoskit.ErrInvalidConfig) {
			t.Errorf("NewRelay accepted a bad option, or refused it without an outbox *ConfigError: %v", err)
		}
	}
	if _, err := outbox.NewRelay(pool); !errors.Is(err, eoskit.ErrInvalidConfig) {
		t.Errorf("NewRelay without brokers returned %v", err)
	}
}

// newTopicWith creates a topic with one config set, deleted when the test
// ends.
func newTopicWith(t *testing.T, k *integration.KafkaCluster, partitions int32, key, value string) string {
	t.Helper()
	topic := integration.UniqueName(t, "t")
	ctx := context.Background()
	resp, err := k.Admin.CreateTopic(ctx, partitions, -1, map[string]*string{key: &value}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = k.Admin.DeleteTopics(context.Background(), topic) })
	return topic
}

// writeTxns commits one database transaction per record, in order, and
// returns their outbox ids.
func (b *bed) writeEach(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	ctx := context.Background()
	for _, r := range recs {
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, r) }); err != nil {
			t.Fatal(err)
		}
	}
}

func (b *bed) idOf(t *testing.T, value string) int64 {
	t.Helper()
	var id int64
	if err := b.pool.QueryRow(context.Background(), `SELECT id FROM eoskit_outbox WHERE value = $1`, []byte(value)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// A record larger than its topic takes, between small ones of the same
// partition and in the same Kafka transaction, stops the relay with a
// *RecordError naming that record (not a neighbour whose produce batch
// it spoiled), and nothing after it in commit order is published. With a
// dead-letter topic, the next relay publishes the others once and in
// order, the big one to the dead letters (without its value), and keeps it
// whole in the dead-letter table.
func TestOversizeRecordIsBlamedAloneAndDeadLettered(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	small := newTopicWith(t, k, 1, "max.message.bytes", "3000")
	dlq := k.NewTopic(1)
	// Random bytes: compression must not shrink it under the limit.
	bigBytes := make([]byte, 5000)
	_, _ = crand.Read(bigBytes)
	big := string(bigBytes)
	var recs []*kgo.Record
	for i := range 20 {
		recs = append(recs, &kgo.Record{Topic: small, Key: []byte("k"), Value: []byte{'a' + byte(i)}})
	}
	recs = append(recs[:10], append([]*kgo.Record{{Topic: small, Key: []byte("k"), Value: []byte(big)}}, recs[10:]...)...)
	b.writeEach(t, recs...)
	bigID := b.idOf(t, big)

	r, err := outbox.NewRelay(b.pool, b.opts(t, outbox.CommitInterval(time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	rerr, ok := errors.AsType[*outbox.RecordError](err)
	if !ok || rerr.ID != bigID || rerr.Topic != small || !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("Run returned %v; want a *RecordError for record %d, MESSAGE_TOO_LARGE", err, bigID)
	}
	for _, rec := range k.ReadAll(small, kgo.ReadCommitted(), time.Minute) {
		if rec.Value[0] > 'j' {
			t.Fatalf("record %q, after the refused one in commit order, was published", rec.Value)
		}
	}

	// What the first relay did not publish: the small records after the
	// refused one, and the refused one.
	left := 21 - len(k.ReadAll(small, kgo.ReadCommitted(), time.Minute))
	m := &countingMetrics{aborted: map[string]int{}}
	relay, err := outbox.NewRelay(b.pool, b.opts(t, outbox.DeadLetter(dlq), outbox.WithMetrics(m))...)
	if err != nil {
		t.Fatal(err)
	}
	if h := relay.Health(); h.Path != "outbox" || h.Running || h.Healthy() {
		t.Fatalf("health before Run: %+v", h)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	waitFor(t, time.Minute, "the dead letter", func() bool { return len(k.ReadNow(dlq, kgo.ReadCommitted(), time.Minute)) == 1 })
	waitFor(t, time.Minute, "the 20 small records", func() bool { return len(k.ReadNow(small, kgo.ReadCommitted(), time.Minute)) >= 20 })
	waitFor(t, time.Minute, "the relay to report every row committed", func() bool { return m.snapshot().committed >= left })
	if h := relay.Health(); !h.Running || !h.Healthy() || h.LastCommit.IsZero() || h.LastAssigned.IsZero() {
		t.Fatalf("health while relaying: %+v", h)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the relay did not stop within a minute of its context's end")
	}
	// The relay reports through the metrics every runner shares: the rows
	// left at its start committed once each, the oversize one dead-lettered
	// once, and the batch Kafka refused whole aborted.
	if got := m.snapshot(); got.committed != left || got.dead != 1 || got.aborted["produce-error"] < 1 {
		t.Fatalf("metrics: %d rows committed, %d dead-lettered, aborts %v; want %d, 1 and a produce-error", got.committed, got.dead, got.aborted, left)
	}
	if h := relay.Health(); h.Running {
		t.Fatalf("health after Run: %+v", h)
	}
	got := k.ReadAll(small, kgo.ReadCommitted(), time.Minute)
	if len(got) != 20 {
		t.Fatalf("%d records on %s; want the 20 small ones once", len(got), small)
	}
	for i, rec := range got {
		if rec.Value[0] != 'a'+byte(i) {
			t.Fatalf("record %d is %q; want %q (commit order)", i, rec.Value, 'a'+byte(i))
		}
	}
	dl := k.ReadAll(dlq, kgo.ReadCommitted(), time.Minute)[0]
	headers := map[string]string{}
	for _, h := range dl.Headers {
		headers[h.Key] = string(h.Value)
	}
	if headers["eoskit-outbox-id"] != strconv.FormatInt(bigID, 10) || headers["eoskit-outbox-topic"] != small ||
		!strings.Contains(headers["eoskit-outbox-error"], "MESSAGE_TOO_LARGE") || dl.Value != nil {
		t.Fatalf("dead letter %+v: want the row's id, topic and error in headers, and no value", headers)
	}
	if n := b.rows(t); n != 0 {
		t.Fatalf("%d rows left in the outbox", n)
	}
	var kept []byte
	if err := b.pool.QueryRow(context.Background(), `SELECT value FROM eoskit_outbox_dead_letters WHERE id = $1 AND error LIKE '%MESSAGE_TOO_LARGE%'`, bigID).Scan(&kept); err != nil || string(kept) != big {
		t.Fatalf("the dead-lettered record is not kept whole in %s: %v", outbox.DeadLetterTable, err)
	}
}

// A record for a topic that does not exist is nobody's fault that
// retrying could not cure: the relay retries for RetryFor, then returns
// a *RecordError naming it; once the topic exists, the next relay
// publishes everything once, in order.
func TestMissingTopicStopsTheRelayAndLosesNothing(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	missing := integration.UniqueName(t, "missing")
	b.writeEach(t, &kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte("before")},
		&kgo.Record{Topic: missing, Key: []byte("k"), Value: []byte("lost?")},
		&kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte("after")})
	missingID := b.idOf(t, "lost?")
	// franz-go fails a missing topic's records after its metadata
	// retries (UnknownTopicRetries), seconds on a loaded machine: in make
	// test, once after RetryFor's 3 s, and once (2026-12-06) after 15 s.
	// RetryFor outlasts them.
	r, err := outbox.NewRelay(b.pool, b.opts(t, outbox.RetryFor(time.Minute))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = r.Run(ctx)
	if rerr, ok := errors.AsType[*outbox.RecordError](err); !ok || rerr.ID != missingID || !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("Run returned %v; want a *RecordError for record %d, UNKNOWN_TOPIC_OR_PARTITION", err, missingID)
	}
	for _, rec := range k.ReadAll(b.out, kgo.ReadCommitted(), time.Minute) {
		if string(rec.Value) == "after" {
			t.Fatal("the record after the unpublishable one was published")
		}
	}
	if resp, err := k.Admin.CreateTopic(ctx, 1, -1, nil, missing); err != nil || resp.Err != nil {
		t.Fatal(err, resp.Err)
	}
	waitFor(t, time.Minute, "the created topic in the metadata", func() bool {
		ends, err := k.Admin.ListEndOffsets(ctx, missing)
		return err == nil && ends.Error() == nil
	})
	t.Cleanup(func() { _, _ = k.Admin.DeleteTopics(context.Background(), missing) })
	run := b.start(t)
	waitFor(t, time.Minute, "the record of the created topic", func() bool { return len(k.ReadNow(missing, kgo.ReadCommitted(), time.Minute)) == 1 })
	waitFor(t, time.Minute, "both others", func() bool { return len(k.ReadNow(b.out, kgo.ReadCommitted(), time.Minute)) >= 2 })
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if got := values(k.ReadAll(b.out, kgo.ReadCommitted(), time.Minute)); got != "before,after" {
		t.Fatalf("output %s; want before,after once each", got)
	}
}

// A record pinned with WriteToPartition to a partition its topic lacks
// is the record's fault, as WriteToPartition says: without a dead-letter
// topic it stops the relay at once (not after RetryFor) with a
// *RecordError naming it; with one, it is dead-lettered and the records
// around it publish once, in order.
func TestPartitionOutOfRangeIsTheRecordsFault(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	ctx := context.Background()
	b.writeEach(t, &kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte("before")})
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return outbox.WriteToPartition(ctx, tx, 6, &kgo.Record{Topic: b.out, Value: []byte("p6")})
	}); err != nil {
		t.Fatal(err)
	}
	pinned := b.idOf(t, "p6")
	b.writeEach(t, &kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte("after")})
	r, err := outbox.NewRelay(b.pool, b.opts(t)...) // RetryFor: its 2-minute default
	if err != nil {
		t.Fatal(err)
	}
	err, took := runFor(t, r, 30*time.Second)
	if rerr, ok := errors.AsType[*outbox.RecordError](err); !ok || rerr.ID != pinned || rerr.Partition != 6 || !errors.Is(err, outbox.ErrInvalidPartition) {
		t.Fatalf("Run returned %v after %s; want a *RecordError for record %d, partition 6", err, took.Round(time.Millisecond), pinned)
	}
	t.Logf("without a dead-letter topic, Run returned after %s: %v", took.Round(time.Millisecond), err)

	dlq := k.NewTopic(1)
	run := b.start(t, outbox.DeadLetter(dlq))
	waitFor(t, 30*time.Second, "the dead letter", func() bool { return len(k.ReadNow(dlq, kgo.ReadCommitted(), time.Minute)) == 1 })
	waitFor(t, 30*time.Second, "the records around it", func() bool { return b.published(t) >= 2 })
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if got := values(k.ReadAll(b.out, kgo.ReadCommitted(), time.Minute)); got != "before,after" {
		t.Fatalf("output %s; want before,after once each", got)
	}
	dl := k.ReadAll(dlq, kgo.ReadCommitted(), time.Minute)[0]
	headers := map[string]string{}
	for _, h := range dl.Headers {
		headers[h.Key] = string(h.Value)
	}
	if headers["eoskit-outbox-id"] != strconv.FormatInt(pinned, 10) || string(dl.Value) != "p6" {
		t.Fatalf("dead letter %q with headers %v; want record %d's", dl.Value, headers, pinned)
	}
	var part *int32
	if err := b.pool.QueryRow(ctx, `SELECT partition FROM eoskit_outbox_dead_letters WHERE id = $1`, pinned).Scan(&part); err != nil || part == nil || *part != 6 {
		t.Fatalf("the dead-letter table does not keep record %d with its partition 6 (%v, %v)", pinned, part, err)
	}
	if n := b.rows(t); n != 0 {
		t.Fatalf("%d rows left in the outbox", n)
	}
}

// The relay needs no superuser: a role with LOGIN and REPLICATION, the
// outbox table's owner (so Migrate can create it and its publication),
// relays; a second relay of the role stands by while the first is live
// (this role can not read reply times in pg_stat_replication), takes over
// once it stalls (ending its session, which the role may), and nothing
// is lost or published twice.
func TestRelayRunsAsAReplicationRoleWithoutSuperuser(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	admin, url := integration.PostgresWithURL(t)
	ctx := context.Background()
	role := replicationRole(t, admin, "relay")
	// Stalled past its transaction timeout, the relay stops keeping its
	// replication session alive, and PostgreSQL ends it 5 s later
	// (wal_sender_timeout), not a minute.
	pool := poolWithWalSenderTimeout(t, url, 5*time.Second, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.User, cfg.ConnConfig.Password = role, "service"
	})
	var super bool
	if err := pool.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil || super {
		t.Fatalf("the test role is a superuser (%v)", err)
	}
	b := newBedOn(t, k, pool, "")
	stalled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var armed atomic.Bool
	zombie := b.start(t, outbox.StatusInterval(time.Second), outbox.ClientOptions(kgo.TransactionTimeout(10*time.Second)), outbox.BeforeCommit(func() {
		if armed.Load() {
			once.Do(func() { close(stalled); <-release })
		}
	}))
	// Live, it keeps the slot from the standby: this role can not see
	// pg_stat_replication's reply times, so the heartbeat must tell.
	if err := b.load.Write(ctx, 500, 2, 10); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the first 500", func() bool { return b.published(t) >= 500 })
	holder := b.holder(t)
	replacement := b.start(t, outbox.StatusInterval(time.Second))
	time.Sleep(5 * time.Second) // more than three status intervals
	if err := b.load.Write(ctx, 500, 2, 10); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the first relay to publish the second 500", func() bool { return b.published(t) >= 1000 })
	if now := b.holder(t); now != holder {
		t.Fatalf("the slot's session changed from %d to %d while its relay was live: the standby took over", holder, now)
	}
	if err := zombie.wait(time.Millisecond); !strings.Contains(fmt.Sprint(err), "did not return") {
		t.Fatalf("the live relay stopped (%v) while the other stood by", err)
	}
	armed.Store(true)
	if err := b.load.Write(ctx, 500, 2, 10); err != nil {
		t.Fatal(err)
	}
	<-stalled
	committed := b.committed(t)
	// Past its transaction timeout (10 s) the stalled relay sends
	// PostgreSQL no status, so wal_sender_timeout (5 s) bounds how long its
	// session outlives the stall: the wait outlasts both, with room for
	// the replacement to take the slot and publish.
	waitFor(t, 2*time.Minute, "every committed record", func() bool { return b.published(t) >= len(committed) })
	close(release)
	if err := zombie.wait(time.Minute); !errors.Is(err, eos.ErrFenced) {
		t.Fatalf("the stalled relay returned %v; want eos.ErrFenced", err)
	}
	if err := replacement.stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("verifier: %v", b.verify(t))
}

// A position of this very slot past the server's log (a server started
// from an older copy of its files, slots included) is refused: trusting
// it would skip, as already published, every record up to it.
func TestPositionFromAnotherIncarnationIsRefused(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	ctx := context.Background()
	var sys string
	if err := b.pool.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sys); err != nil {
		t.Fatal(err)
	}
	// The slot's own token: the same slot, as a cold copy of the
	// server's files (slots included) would have it.
	if _, err := b.pool.Exec(ctx, `INSERT INTO eoskit_outbox_slots (slot, token) VALUES ($1, 'copied')`, b.slot); err != nil {
		t.Fatal(err)
	}
	cl := k.Client()
	rec := &kgo.Record{Topic: b.positions, Partition: 0, Key: []byte(sys + "/" + b.slot), Value: []byte(`{"lsn":"FFF/0","key":"x","token":"copied"}`)}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	b.writeEach(t, &kgo.Record{Topic: b.out, Value: []byte("must not be skipped")})
	r, err := outbox.NewRelay(b.pool, b.opts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := r.Run(rctx); !errors.Is(err, outbox.ErrPosition) {
		t.Fatalf("Run returned %v; want ErrPosition", err)
	}
}

// A position left by an earlier slot of the same name (the slot dropped
// and created again, as after restoring a server from a backup, which
// keeps no slots) does not count for the new slot: trusting it would skip,
// as already published, the new slot's records below it.
func TestPositionOfAnEarlierSlotIsIgnored(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	ctx := context.Background()
	if err := outbox.DropSlot(ctx, b.pool, b.slot); err != nil {
		t.Fatal(err)
	}
	if err := outbox.CreateSlot(ctx, b.pool, b.slot); err != nil {
		t.Fatal(err)
	}
	b.writeEach(t, &kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte("new slot's")})
	var sys, wal string
	if err := b.pool.QueryRow(ctx, `SELECT system_identifier::text, pg_current_wal_lsn()::text FROM pg_control_system()`).Scan(&sys, &wal); err != nil {
		t.Fatal(err)
	}
	// The earlier slot's position: past the new record, within the log.
	rec := &kgo.Record{Topic: b.positions, Key: []byte(sys + "/" + b.slot), Value: fmt.Appendf(nil, `{"lsn":%q,"key":"x","token":"earlier"}`, wal)}
	if err := k.Client().ProduceSync(ctx, rec).FirstErr(); err != nil {
		t.Fatal(err)
	}
	run := b.start(t)
	waitFor(t, time.Minute, "the new slot's record", func() bool { return b.published(t) == 1 })
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
}

// countingMetrics records what a relay reports.
type countingMetrics struct {
	eoskit.NopMetrics
	mu        sync.Mutex
	committed int
	dead      int
	aborted   map[string]int
}

func (m *countingMetrics) Committed(in, _ int, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.committed += in
}

func (m *countingMetrics) DeadLettered(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dead += n
}

func (m *countingMetrics) Aborted(reason string, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.aborted[reason]++
}

func (m *countingMetrics) snapshot() countingMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	return countingMetrics{committed: m.committed, dead: m.dead, aborted: maps.Clone(m.aborted)}
}

// runFor runs a relay until it returns or within elapses, and returns
// Run's error and how long it took; a Run still going at within is an
// error naming the wait.
func runFor(t *testing.T, r *outbox.Relay, within time.Duration) (error, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-done:
		return err, time.Since(began)
	case <-time.After(within):
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("the relay did not stop within a minute of its context's end")
		}
		return fmt.Errorf("Run did not return within %s", within), time.Since(began)
	}
}

// wantConfigError fails t unless err is an outbox *eoskit.ConfigError naming
// setting.
func wantConfigError(t *testing.T, err error, took time.Duration, setting string) {
	t.Helper()
	cerr, ok := errors.AsType[*eoskit.ConfigError](err)
	if !ok || cerr.Package != "outbox" || cerr.Setting != setting || !errors.Is(err, eoskit.ErrInvalidConfig) {
		t.Fatalf("Run returned %v after %s; want an outbox *eoskit.ConfigError naming %s", err, took.Round(time.Millisecond), setting)
	}
	t.Logf("Run returned after %s: %v", took.Round(time.Millisecond), err)
}

// A position topic or a dead-letter topic that does not exist is a
// configuration error, reported within seconds of Run's start (not after
// RetryFor of retries), naming the setting.
func TestMissingPositionOrDeadLetterTopicIsAConfigError(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	b.writeEach(t, &kgo.Record{Topic: b.out, Value: []byte("waits")})
	for _, c := range []struct {
		setting string
		opt     outbox.Option
	}{
		{"PositionTopic", outbox.PositionTopic(integration.UniqueName(t, "no-positions"))},
		{"DeadLetter", outbox.DeadLetter(integration.UniqueName(t, "no-dead-letters"))},
	} {
		r, err := outbox.NewRelay(b.pool, b.opts(t, c.opt)...)
		if err != nil {
			t.Fatal(err)
		}
		err, took := runFor(t, r, 10*time.Second)
		wantConfigError(t, err, took, c.setting)
	}
	if n := b.published(t); n != 0 {
		t.Fatalf("%d records published by relays whose configuration was refused", n)
	}
}

// A position topic deleted while the relay runs is a configuration error
// too, within seconds of the first publish that needs it; the record is
// not published (it stays in the slot's log).
func TestDeletedPositionTopicIsAConfigError(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	r, err := outbox.NewRelay(b.pool, b.opts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	b.writeEach(t, &kgo.Record{Topic: b.out, Value: []byte("first")})
	waitFor(t, time.Minute, "the first record", func() bool { return b.published(t) == 1 })
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	defer dcancel()
	resp, err := k.Admin.DeleteTopics(dctx, b.positions)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the deleted topic gone from the metadata", func() bool {
		md, err := k.Admin.Metadata(dctx, b.positions)
		return err == nil && md.Topics[b.positions].Err != nil
	})
	b.writeEach(t, &kgo.Record{Topic: b.out, Value: []byte("second")})
	began := time.Now()
	select {
	case err := <-done:
		wantConfigError(t, err, time.Since(began), "PositionTopic")
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s of a record needing the deleted position topic")
	}
	if n := b.published(t); n != 1 {
		t.Fatalf("%d records published; want the first alone", n)
	}
}

// Relays of several slots share a position topic. Another slot's relay
// (here a transactional producer writing what it would) aborts a
// transaction, the last thing in the topic; then another leaves one open.
// A relay starting after either reads its position within seconds (it
// waits for neither), and so does one whose own committed position lies
// past that open transaction, which it must not miss: every record is
// published once.
func TestPositionReadPassesOthersAbortedAndOpenTransactions(t *testing.T) {
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
	var sys string
	if err := b.pool.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sys); err != nil {
		t.Fatal(err)
	}
	// What the other slot's relay would write: its position, in a
	// transaction, here aborted.
	position := func(cl *kgo.Client, end kgo.TransactionEndTry) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: b.positions, Key: []byte(sys + "/other_slot"), Value: []byte(`{"lsn":"0/1","key":"x","token":"y"}`)}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if end == kgo.TryAbort {
			if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
				t.Fatal(err)
			}
		}
	}
	aborter := k.Client(kgo.TransactionalID(integration.UniqueName(t, "aborts")))
	position(aborter, kgo.TryAbort)
	k.ReadAll(b.positions, kgo.ReadCommitted(), 30*time.Second) // its marker written
	// Each phase writes a record, starts a relay, which must read its
	// position and publish the record within seconds, and stops it.
	for i, phase := range []string{
		"after an abort at the topic's end",
		"while another transaction is open on the topic",
		"with its own position past that open transaction",
	} {
		if i == 1 {
			opener := k.Client(kgo.TransactionalID(integration.UniqueName(t, "open")), kgo.TransactionTimeout(5*time.Minute))
			position(opener, kgo.TryCommit) // left open
			t.Cleanup(func() { _ = opener.EndTransaction(context.Background(), kgo.TryAbort) })
		}
		b.writeEach(t, &kgo.Record{Topic: b.out, Key: []byte("k"), Value: []byte{'2' + byte(i)}})
		began := time.Now()
		// In the open phase the relay's session ends right after its
		// commit, as a crash would, before the slot is told: the next
		// session's slot streams the record again, and only the position
		// in Kafka, which lies past the open transaction, says it is
		// published.
		var crashed atomic.Bool
		run := b.start(t, outbox.RetryFor(time.Minute), outbox.AfterCommit(func() bool { return i == 1 && crashed.CompareAndSwap(false, true) }))
		deadline := time.Now().Add(15 * time.Second)
		for b.published(t) < 2+i {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the relay published nothing within 15 s of its start (its position read waits?)", phase)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if i == 1 {
			waitFor(t, 15*time.Second, "the session after the crash to read its position", func() bool {
				h := run.relay.Health()
				return crashed.Load() && h.LastError != "" && h.LastAssigned.After(h.LastErrorAt)
			})
		}
		t.Logf("%s: published after %s", phase, time.Since(began).Round(time.Millisecond))
		if err := run.stop(); err != nil {
			t.Fatal(err)
		}
	}
	if got := values(k.ReadNow(b.out, kgo.ReadCommitted(), time.Minute)); got != "1,2,3,4" {
		t.Fatalf("output %s; want 1,2,3,4 once each", got)
	}
}

// The replication connection is made with the pool's configuration at
// every connect: a BeforeConnect hook that sets the password (rotating
// credentials; the configuration's own is wrong) is called for it too,
// and the relay replicates.
func TestReplicationConnectionUsesBeforeConnect(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	_, url := integration.PostgresWithURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	password := cfg.ConnConfig.Password
	cfg.ConnConfig.Password = "wrong"
	var calls atomic.Int64
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		calls.Add(1)
		cc.Password = password
		return nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b := newBedOn(t, k, pool, url)
	b.writeEach(t, &kgo.Record{Topic: b.out, Value: []byte("rotated")})
	run := b.start(t, outbox.RetryFor(10*time.Second))
	deadline := time.Now().Add(30 * time.Second)
	for b.published(t) < 1 {
		if err := run.wait(0); !strings.Contains(fmt.Sprint(err), "did not return") {
			t.Fatalf("the relay stopped: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing published within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	// The pool's own connects, and the relay's two replication connects
	// (identifying the server, then the stream).
	got, pooled := calls.Load(), pool.Stat().NewConnsCount()
	if got < pooled+2 {
		t.Fatalf("BeforeConnect called %d times for %d pool connections; want the relay's replication connects counted too", got, pooled)
	}
	t.Logf("BeforeConnect called %d times: %d pool connections and %d replication connects", got, pooled, got-pooled)
}

// A record pinned to a partition added after the relay's producer loaded
// the topic's metadata is no record's fault: the relay looks the topic up
// afresh, finds the partition, and publishes the record there (with a new
// producer) instead of dead-lettering it.
func TestPinnedToAPartitionJustAddedIsPublished(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	b := newBed(t, k)
	ctx := context.Background()
	topic, dlq := k.NewTopic(1), k.NewTopic(1)
	pinned := func(p int32, value string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			return outbox.WriteToPartition(ctx, tx, p, &kgo.Record{Topic: topic, Value: []byte(value)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	run := b.start(t, outbox.DeadLetter(dlq))
	pinned(0, "p0")
	waitFor(t, 30*time.Second, "the record for partition 0", func() bool { return len(k.ReadNow(topic, kgo.ReadCommitted(), time.Minute)) == 1 })
	resp, err := k.Admin.UpdatePartitions(ctx, 3, topic)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "3 partitions in the metadata", func() bool {
		md, err := k.Admin.Metadata(ctx, topic)
		return err == nil && len(md.Topics[topic].Partitions) == 3
	})
	pinned(2, "p2")
	waitFor(t, 30*time.Second, "the record for partition 2", func() bool { return len(k.ReadNow(topic, kgo.ReadCommitted(), time.Minute)) == 2 })
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	for _, rec := range k.ReadAll(topic, kgo.ReadCommitted(), time.Minute) {
		if want := int32(rec.Value[1] - '0'); rec.Partition != want {
			t.Fatalf("record %q on partition %d; want %d", rec.Value, rec.Partition, want)
		}
	}
	if n := len(k.ReadAll(dlq, kgo.ReadCommitted(), time.Minute)); n != 0 {
		t.Fatalf("%d dead letters; want none", n)
	}
}
