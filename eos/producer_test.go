package eos_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/verify"
)

const readTimeout = 30 * time.Second

func newTxnProducer(t *testing.T, k *integration.KafkaCluster, txnID string) *eos.TransactionalProducer {
	t.Helper()
	p, err := eos.NewTransactionalProducer(eos.Brokers(k.Brokers...), eos.TransactionalID(txnID), eos.Logger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func ids(recs []*kgo.Record) map[string]int {
	m := map[string]int{}
	for _, r := range recs {
		m[string(r.Value)]++
	}
	return m
}

// produceBoth writes n records to each of two topics, keyed so that they
// spread over a's partitions.
func produceBoth(tx *eos.Tx, a, b string, n int) {
	for i := range n {
		tx.Produce(&kgo.Record{Topic: a, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "a%d", i)})
		tx.Produce(&kgo.Record{Topic: b, Value: fmt.Appendf(nil, "b%d", i)})
	}
}

func TestTransactCommitsAcrossTopicsAndPartitionsAtomically(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	a, b := k.NewTopic(2), k.NewTopic(1)
	p := newTxnProducer(t, k, integration.UniqueName(t, "tx"))
	ctx := context.Background()

	err := p.Transact(ctx, func(tx *eos.Tx) error {
		produceBoth(tx, a, b, 50)
		if err := tx.ProduceSync(); err != nil {
			return err
		}
		// Acknowledged but not committed: invisible on both topics.
		if n := len(k.ReadNow(a, kgo.ReadCommitted(), readTimeout)) + len(k.ReadNow(b, kgo.ReadCommitted(), readTimeout)); n != 0 {
			return fmt.Errorf("%d records visible before commit", n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Transact: %v", err)
	}
	gotA, gotB := k.ReadAll(a, kgo.ReadCommitted(), readTimeout), k.ReadAll(b, kgo.ReadCommitted(), readTimeout)
	parts := map[int32]int{}
	for _, r := range gotA {
		parts[r.Partition]++
	}
	if len(ids(gotA)) != 50 || len(ids(gotB)) != 50 || parts[0] == 0 || parts[1] == 0 {
		t.Fatalf("after commit: %d distinct on a (per partition %v), %d on b; want 50 over both partitions, and 50", len(ids(gotA)), parts, len(ids(gotB)))
	}
}

// assertAbortedInvisible checks that the topic's log holds want records of
// an aborted transaction and that read_committed shows none of them.
func assertAbortedInvisible(t *testing.T, k *integration.KafkaCluster, topic string, want int) {
	t.Helper()
	if got := k.ReadAll(topic, kgo.ReadCommitted(), readTimeout); len(got) != 0 {
		t.Fatalf("%d records of an aborted transaction visible to read_committed", len(got))
	}
	if got := len(verify.AbortedPositions(k.ReadRaw(topic, readTimeout))); got != want {
		t.Fatalf("log holds %d aborted records, want %d", got, want)
	}
}

func TestTransactAbortsWhenTheFunctionFails(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	a, b := k.NewTopic(2), k.NewTopic(1)
	p := newTxnProducer(t, k, integration.UniqueName(t, "tx"))
	boom := errors.New("boom")

	err := p.Transact(context.Background(), func(tx *eos.Tx) error {
		produceBoth(tx, a, b, 10)
		if err := tx.ProduceSync(); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, eos.ErrAborted) || !errors.Is(err, boom) {
		t.Fatalf("Transact = %v, want ErrAborted wrapping the function's error", err)
	}
	assertAbortedInvisible(t, k, a, 10)
	assertAbortedInvisible(t, k, b, 10)

	// The producer goes on after an abort.
	if err := p.Transact(context.Background(), func(tx *eos.Tx) error { return tx.ProduceSync(&kgo.Record{Topic: a, Value: []byte("next")}) }); err != nil {
		t.Fatalf("Transact after an abort: %v", err)
	}
	if got := ids(k.ReadAll(a, kgo.ReadCommitted(), readTimeout)); len(got) != 1 || got["next"] != 1 {
		t.Fatalf("read_committed = %v, want only the next transaction's record", got)
	}
}

func TestTransactAbortsWhenARecordFails(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(1)
	p := newTxnProducer(t, k, integration.UniqueName(t, "tx"))

	err := p.Transact(context.Background(), func(tx *eos.Tx) error {
		tx.Produce(&kgo.Record{Topic: topic, Value: []byte("good")})
		// Over the broker's 1 MiB message.max.bytes: rejected.
		tx.Produce(&kgo.Record{Topic: topic, Value: bytes.Repeat([]byte("x"), 2<<20)})
		return nil // the function does not notice; Transact must
	})
	var perr *eos.ProduceError
	if !errors.Is(err, eos.ErrAborted) || !errors.As(err, &perr) || !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("Transact = %v, want ErrAborted with a *ProduceError wrapping MessageTooLarge", err)
	}
	if perr.Topic != topic {
		t.Fatalf("ProduceError names topic %q, want %q", perr.Topic, topic)
	}
	if got := k.ReadAll(topic, kgo.ReadCommitted(), readTimeout); len(got) != 0 {
		t.Fatalf("%d records visible although a record of the transaction failed", len(got))
	}
}

func TestTransactAbortsAndRepanicsWhenTheFunctionPanics(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(1)
	p := newTxnProducer(t, k, integration.UniqueName(t, "tx"))

	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Fatalf("recovered %v, want the function's panic re-raised", r)
			}
		}()
		_ = p.Transact(context.Background(), func(tx *eos.Tx) error {
			if err := tx.ProduceSync(&kgo.Record{Topic: topic, Value: []byte("doomed")}); err != nil {
				return err
			}
			panic("kaboom")
		})
	}()
	assertAbortedInvisible(t, k, topic, 1)
	if err := p.Transact(context.Background(), func(tx *eos.Tx) error { return nil }); err != nil {
		t.Fatalf("Transact after a panic: %v", err)
	}
}

func TestTransactAbortsWhenTheContextIsCancelled(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(1)
	p := newTxnProducer(t, k, integration.UniqueName(t, "tx"))

	ctx, cancel := context.WithCancel(context.Background())
	err := p.Transact(ctx, func(tx *eos.Tx) error {
		if err := tx.ProduceSync(&kgo.Record{Topic: topic, Value: []byte("doomed")}); err != nil {
			return err
		}
		cancel()
		return nil
	})
	if !errors.Is(err, eos.ErrAborted) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Transact = %v, want ErrAborted wrapping context.Canceled", err)
	}
	assertAbortedInvisible(t, k, topic, 1)
}

func TestTransactionalProducerIsFencedByANewerInstance(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(1)
	txnID := integration.UniqueName(t, "tx")
	old := newTxnProducer(t, k, txnID)
	ctx := context.Background()
	write := func(p *eos.TransactionalProducer, v string) error {
		return p.Transact(ctx, func(tx *eos.Tx) error { return tx.ProduceSync(&kgo.Record{Topic: topic, Value: []byte(v)}) })
	}
	if err := write(old, "old-1"); err != nil {
		t.Fatal(err)
	}
	oldID, oldEpoch, err := old.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}

	newer := newTxnProducer(t, k, txnID)
	if err := write(newer, "new-1"); err != nil {
		t.Fatal(err)
	}
	newID, newEpoch, err := newer.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if newID != oldID || newEpoch <= oldEpoch {
		t.Fatalf("newer instance has producer %d epoch %d; want the same id as %d with an epoch above %d", newID, newEpoch, oldID, oldEpoch)
	}

	for i := range 2 { // fenced is final: the second call says so too
		if err := write(old, fmt.Sprintf("zombie-%d", i)); !errors.Is(err, eos.ErrFenced) {
			t.Fatalf("zombie write %d = %v, want ErrFenced", i, err)
		}
	}
	got := ids(k.ReadAll(topic, kgo.ReadCommitted(), readTimeout))
	if len(got) != 2 || got["old-1"] != 1 || got["new-1"] != 1 {
		t.Fatalf("read_committed = %v, want old-1 and new-1 only", got)
	}
}

func TestIdempotentProducerReportsIDAndTypedErrors(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(2)
	p, err := eos.NewIdempotentProducer(eos.Brokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()

	var recs []*kgo.Record
	for i := range 100 {
		recs = append(recs, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)})
	}
	if err := p.Produce(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	id, epoch, err := p.ProducerID(ctx)
	if err != nil || id < 0 || epoch < 0 {
		t.Fatalf("ProducerID = %d, %d, %v", id, epoch, err)
	}
	if got := ids(k.ReadAll(topic, kgo.ReadCommitted(), readTimeout)); len(got) != 100 {
		t.Fatalf("read %d distinct values, want 100", len(got))
	}

	err = p.Produce(ctx, &kgo.Record{Topic: topic, Value: bytes.Repeat([]byte("x"), 2<<20)})
	var perr *eos.ProduceError
	if !errors.As(err, &perr) || !errors.Is(err, kerr.MessageTooLarge) || perr.Topic != topic {
		t.Fatalf("oversized Produce = %v, want a *ProduceError wrapping MessageTooLarge", err)
	}
}

// A function that outlives the transaction timeout (5 s here) has its
// transaction aborted by the coordinator, which bumps the epoch: the
// commit then fails with an epoch error that reads like fencing, though
// nobody else owns the id. Transact must say so with ErrTransactionTimedOut
// (wrapped with ErrAborted, not ErrFenced), and the producer must stay
// usable: the next transaction commits, and only its record is visible.
func TestTransactOutlivingItsTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(1)
	txnID := integration.UniqueName(t, "tx")
	// franz-go's log, shown if the end fails: which path each
	// EndTransaction took, and the epochs.
	var franz integration.LogBuffer
	p, err := eos.NewTransactionalProducer(eos.Brokers(k.Brokers...), eos.TransactionalID(txnID), eos.Logger(testLogger(t)),
		eos.ClientOptions(kgo.TransactionTimeout(5*time.Second), kgo.WithLogger(kgo.BasicLogger(&franz, kgo.LogLevelInfo, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx := context.Background()
	err = p.Transact(ctx, func(tx *eos.Tx) error {
		if err := tx.ProduceSync(&kgo.Record{Topic: topic, Value: []byte("timed-out")}); err != nil {
			return err
		}
		return waitForCoordinatorAbort(k, txnID, 45*time.Second)
	})
	if !errors.Is(err, eos.ErrTransactionTimedOut) || !errors.Is(err, eos.ErrAborted) || errors.Is(err, eos.ErrFenced) {
		t.Fatalf("Transact past the timeout = %v; want ErrTransactionTimedOut and ErrAborted, not ErrFenced", err)
	}
	second := time.Now()
	if err := p.Transact(ctx, func(tx *eos.Tx) error {
		return tx.ProduceSync(&kgo.Record{Topic: topic, Value: []byte("after")})
	}); err != nil {
		t.Fatalf("the transaction after the timeout = %v; want it committed", err)
	}
	took, read := time.Since(second), time.Now()
	got := ids(k.ReadAll(topic, kgo.ReadCommitted(), readTimeout))
	if len(got) != 1 || got["after"] != 1 {
		// Seen once under make test's load (read_committed empty), not
		// reproduced since: what the log holds, markers and epochs, to
		// tell an aborted "after" from a misread.
		t.Errorf("read_committed = %v, want only the record of the transaction after the timeout (that transaction took %s, the read %s)",
			got, took.Round(time.Millisecond), time.Since(read).Round(time.Millisecond))
		raw, err := verify.ReadTopicWith(context.Background(), []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, topic, kgo.ReadUncommitted(), false, true, readTimeout)
		for _, r := range raw {
			kind := string(r.Value)
			if r.Attrs.IsControl() {
				kind = "marker " + markerKind(r.Key)
			}
			t.Logf("the log: %d: %s (producer %d, epoch %d)", r.Offset, kind, r.ProducerID, r.ProducerEpoch)
		}
		d, derr := k.Admin.DescribeTransactions(context.Background(), txnID)
		t.Logf("read error %v; the coordinator: %+v (%v); franz-go's log:\n%s", err, d[txnID], derr, franz.String())
	}
}

// markerKind names a control record by its key (version int16, type
// int16: 0 abort, 1 commit).
func markerKind(key []byte) string {
	if len(key) < 4 {
		return fmt.Sprintf("key %x", key)
	}
	switch typ := binary.BigEndian.Uint16(key[2:4]); typ {
	case 0:
		return "abort"
	case 1:
		return "commit"
	default:
		return fmt.Sprintf("type %d", typ)
	}
}
