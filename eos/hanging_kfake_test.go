package eos_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// TestProcessorStartsAtOnceWhereTheHangingCheckCannotLookEverywhere runs a
// Processor with the default hanging-transaction check on kfake, which
// lists no __consumer_offsets topic. It used to retry the check for a
// minute, twice, before consuming (ExampleProcessor_Run took 120 s); now it
// copies its first record at once, and says once at Warn that the check
// covers only the output partitions.
func TestProcessorStartsAtOnceWhereTheHangingCheckCannotLookEverywhere(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	var logs integration.LogBuffer
	txnID, _ := eos.StableTransactionalID("kfake", "0")
	p, err := eos.NewProcessor(copyHandler("out"), eos.Brokers(brokers...), eos.Group("kfake"), eos.Topics("in"),
		eos.TransactionalID(txnID), eos.CommitInterval(50*time.Millisecond),
		eos.HangingTransactionCheck(300*time.Millisecond),
		eos.Logger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic("in"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(seed.Close)
	if err := seed.ProduceSync(context.Background(), &kgo.Record{Value: []byte("first")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- p.Run(ctx) }()
	reader, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("out"), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)
	pollCtx, pollCancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer pollCancel()
	if reader.PollFetches(pollCtx).NumRecords() == 0 {
		t.Fatalf("no output within 10 s; logs:\n%s", logs.String())
	}
	took := time.Since(began)
	t.Logf("first output %s after Run", took.Round(time.Millisecond))
	// A bound on a stall, not a speed goal: the check used to hold the
	// start for 60 s. The issue asks for a second; 0.1 s is typical, and
	// the bound leaves room for a loaded CI machine running -race.
	if took > 2*time.Second {
		t.Errorf("first output took %s; the hanging-transaction check must not hold the start", took)
	}
	time.Sleep(time.Second) // a few periodic checks
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run returned %v", err)
	}
	const said = "covers only the partitions this processor writes to"
	if n := strings.Count(logs.String(), said); n != 1 {
		t.Errorf("the warning %q was logged %d times, want once; logs:\n%s", said, n, logs.String())
	}
}

// RepairHangingTransactions writes the outcome it reads from an epoch per
// transaction, which only transaction protocol v2 gives: Run refuses it,
// before anything is written, on a cluster without v2 (kfake capped at
// 3.9) and for a client capped below it (a cluster that offers v2 still
// serves v1 to such a client, and franz-go then speaks v1).
func TestRepairIsRefusedWithoutTransactionProtocolV2(t *testing.T) {
	for name, c := range map[string]struct {
		cluster []kfake.Opt
		client  []kgo.Opt
		names   string
	}{
		"cluster v1": {cluster: []kfake.Opt{kfake.MaxVersions(kversion.V3_9_0())}, names: "transaction.version"},
		"client v1":  {client: []kgo.Opt{kgo.MaxVersions(kversion.V3_9_0())}, names: "MaxVersions"},
	} {
		t.Run(name, func(t *testing.T) {
			cluster, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(1, "in", "out")}, c.cluster...)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cluster.Close)
			txnID, _ := eos.StableTransactionalID("kfake", "0")
			p, err := eos.NewProcessor(copyHandler("out"), eos.Brokers(cluster.ListenAddrs()...), eos.Group("kfake"), eos.Topics("in"),
				eos.TransactionalID(txnID), eos.OnHangingTransaction(eos.RepairHangingTransactions()), eos.ClientOptions(c.client...))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = p.Run(ctx)
			var cerr *eoskit.ConfigError
			if !errors.As(err, &cerr) || cerr.Setting != "OnHangingTransaction" || !strings.Contains(err.Error(), c.names) {
				t.Fatalf("Run returned %v; want a *ConfigError for OnHangingTransaction naming %s", err, c.names)
			}
		})
	}
}
