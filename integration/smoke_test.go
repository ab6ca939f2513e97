package integration_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
)

// The smoke suite shows that the primitives eoskit builds on behave as
// Apache Kafka documents them on the broker under test. None of these
// properties hold for a fake that ignores transactions.

const readTimeout = 30 * time.Second

func produceSync(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func values(recs []*kgo.Record) map[string]int {
	seen := map[string]int{}
	for _, r := range recs {
		seen[string(r.Value)]++
	}
	return seen
}

func TestSmokeIdempotentProducerWritesEachRecordOnce(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(3)
	cl := k.Client(kgo.DefaultProduceTopic(topic), kgo.RequiredAcks(kgo.AllISRAcks()))

	const n = 1000
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Key: fmt.Appendf(nil, "k%d", i%17), Value: fmt.Appendf(nil, "v%d", i)}
	}
	produceSync(t, cl, recs...)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil || id < 0 {
		t.Fatalf("idempotent producer has no producer id: id=%d epoch=%d err=%v", id, epoch, err)
	}
	// The broker keeps state for the producer id only if the writes really
	// were idempotent (sequence-numbered) batches.
	described, err := k.Admin.DescribeProducers(ctx, kadm.TopicsSet{topic: {0: {}, 1: {}, 2: {}}})
	if err != nil {
		t.Fatalf("describe producers: %v", err)
	}
	found := false
	described.EachProducer(func(p kadm.DescribedProducer) {
		if p.ProducerID == id {
			found = true
		}
	})
	if !found {
		t.Fatalf("broker has no producer state for producer id %d", id)
	}

	got := values(k.ReadAll(topic, kgo.ReadCommitted(), readTimeout))
	if len(got) != n {
		t.Fatalf("read %d distinct values, want %d", len(got), n)
	}
	for v, c := range got {
		if c != 1 {
			t.Errorf("value %s read %d times", v, c)
		}
	}
}

func TestSmokeTransactionAcrossPartitionsIsAtomic(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(2)
	cl := k.Client(
		kgo.TransactionalID(integration.UniqueName(t, "tx")),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(topic),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		produceSync(t, cl, &kgo.Record{Partition: int32(i % 2), Value: fmt.Appendf(nil, "v%d", i)})
	}
	// Written but not committed: a read_committed reader sees nothing on
	// either partition, a read_uncommitted one sees everything.
	if got := k.ReadNow(topic, kgo.ReadCommitted(), readTimeout); len(got) != 0 {
		t.Fatalf("read_committed saw %d records of an open transaction", len(got))
	}
	if got := k.ReadNow(topic, kgo.ReadUncommitted(), readTimeout); len(got) != 10 {
		t.Fatalf("read_uncommitted saw %d records, want 10", len(got))
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit: %v", err)
	}

	perPartition := map[int32]int{}
	for _, r := range k.ReadAll(topic, kgo.ReadCommitted(), readTimeout) {
		perPartition[r.Partition]++
	}
	if perPartition[0] != 5 || perPartition[1] != 5 {
		t.Fatalf("after commit read_committed saw %v per partition, want 5 on each of 0 and 1", perPartition)
	}
}

func TestSmokeAbortedTransactionIsInvisibleToReadCommitted(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(1)
	cl := k.Client(kgo.TransactionalID(integration.UniqueName(t, "tx")), kgo.DefaultProduceTopic(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	commitOne := func(v string) {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		produceSync(t, cl, &kgo.Record{Value: []byte(v)})
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	commitOne("before")
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		produceSync(t, cl, &kgo.Record{Value: fmt.Appendf(nil, "aborted%d", i)})
	}
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatalf("abort: %v", err)
	}
	commitOne("after")

	committed := values(k.ReadAll(topic, kgo.ReadCommitted(), readTimeout))
	if len(committed) != 2 || committed["before"] != 1 || committed["after"] != 1 {
		t.Fatalf("read_committed saw %v, want only before and after", committed)
	}
	uncommitted := values(k.ReadAll(topic, kgo.ReadUncommitted(), readTimeout))
	if len(uncommitted) != 7 || uncommitted["aborted0"] != 1 {
		t.Fatalf("read_uncommitted saw %v, want the 5 aborted records too", uncommitted)
	}
}

func TestSmokeSecondProducerWithSameTransactionalIDFencesTheFirst(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(1)
	txnID := integration.UniqueName(t, "tx")
	first := k.Client(kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	if err := first.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produceSync(t, first, &kgo.Record{Value: []byte("zombie")})

	// InitProducerID with the same transactional id bumps the epoch and
	// aborts the first producer's open transaction.
	second := k.Client(kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(topic))
	if _, _, err := second.ProducerID(ctx); err != nil {
		t.Fatalf("second producer init: %v", err)
	}
	if err := second.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produceSync(t, second, &kgo.Record{Value: []byte("successor")})
	if err := second.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("second producer commit: %v", err)
	}

	err := first.EndTransaction(ctx, kgo.TryCommit)
	if !errors.Is(err, kerr.ProducerFenced) && !errors.Is(err, kerr.InvalidProducerEpoch) {
		t.Fatalf("first producer's commit after being fenced returned %v, want ProducerFenced or InvalidProducerEpoch", err)
	}
	got := values(k.ReadAll(topic, kgo.ReadCommitted(), readTimeout))
	if len(got) != 1 || got["successor"] != 1 {
		t.Fatalf("read_committed saw %v, want only the successor's record", got)
	}
}

func TestPostgresGivesEachTestItsOwnDatabase(t *testing.T) {
	t.Parallel()
	a := integration.Postgres(t)
	b := integration.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	if _, err := a.Exec(ctx, `CREATE TABLE only_in_a (id int PRIMARY KEY); INSERT INTO only_in_a VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := a.QueryRow(ctx, `SELECT count(*) FROM only_in_a`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("count in a: n=%d err=%v", n, err)
	}
	var exists bool
	if err := b.QueryRow(ctx, `SELECT to_regclass('only_in_a') IS NOT NULL`).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatal("a table created in one test database is visible in another")
	}
}
