package eos_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eoskit/eoskit/eos"
)

// A transaction whose abort could not reach its coordinator (unreachable
// past the abort's 30 s) leaves franz-go in the transaction; the next
// Transact ends it first, once the coordinator is back, and commits. Before,
// every later Transact failed with "already in a transaction" for good
// (issue 43 item 3, failing on 3bfa998).
func TestTransactAfterAnAbortThatFailed(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	var down atomic.Bool
	cluster.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !down.Load() {
			return nil, nil, false
		}
		resp := req.(*kmsg.EndTxnRequest).ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
		return resp, nil, true
	})
	p, err := eos.NewTransactionalProducer(eos.Brokers(cluster.ListenAddrs()...), eos.TransactionalID("wedge"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx := context.Background()
	errFn := errors.New("the handler failed")
	down.Store(true)
	time.AfterFunc(35*time.Second, func() { down.Store(false) }) // a coordinator gone for 35 s
	err = p.Transact(ctx, func(tx *eos.Tx) error {
		tx.Produce(&kgo.Record{Topic: "out", Value: []byte("aborted")})
		return errFn
	})
	if !errors.Is(err, errFn) || !errors.Is(err, kerr.CoordinatorNotAvailable) {
		t.Fatalf("Transact = %v, want the handler's error and the abort's failure: the test proves nothing otherwise", err)
	}
	t.Logf("the first Transact, its abort unreachable: %v", err)
	for down.Load() {
		time.Sleep(100 * time.Millisecond)
	}
	if err := p.Transact(ctx, func(tx *eos.Tx) error {
		return tx.ProduceSync(&kgo.Record{Topic: "out", Value: []byte("committed")})
	}); err != nil {
		t.Fatalf("Transact once the coordinator is back = %v, want nil", err)
	}
	reader, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("out"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)
	pollCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var got []string
	for len(got) == 0 && pollCtx.Err() == nil {
		reader.PollFetches(pollCtx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if len(got) != 1 || got[0] != "committed" {
		t.Fatalf("read_committed read %q, want [committed]", got)
	}
}
