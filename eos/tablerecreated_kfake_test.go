package eos_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// A table topic deleted and created again while a processor follows it,
// the new topic holding more records than the old (so that its end lies
// past the position the keyed state holds, and offsets alone cannot tell
// the topics apart): no case is joined with the new topic's records
// taken from the old one's position on (a table that never was); Run ends
// with a *eoskit.ConfigError naming the table within seconds, and so does
// a second processor starting on that state. Before the fix, both ran on,
// joining every later case with the old table.
func TestATableCreatedAgainIsRefusedNotMixed(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "cases", "regions", "joined", "dead"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seed, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	adm := kadm.NewClient(seed)
	base := time.Now().Add(-time.Hour)
	// names writes every region's name, version v, times after base.
	names := func(v int, at time.Time) {
		t.Helper()
		var rs []*kgo.Record
		for k := range 10 {
			rs = append(rs, &kgo.Record{Topic: "regions", Key: fmt.Appendf(nil, "r%d", k), Value: fmt.Appendf(nil, "v%d", v), Timestamp: at})
		}
		if err := seed.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cases := func(n int, at time.Time) {
		t.Helper()
		var rs []*kgo.Record
		for i := range n {
			rs = append(rs, &kgo.Record{Topic: "cases", Key: fmt.Appendf(nil, "r%d", i%10), Timestamp: at})
		}
		if err := seed.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	names(1, base)
	cases(30, base.Add(time.Minute))

	table := eos.NewTable("regions", eos.TableRestoreTimeout(2*time.Second))
	newProc := func() (*eos.Processor, chan error, context.CancelFunc) {
		p, err := eos.NewProcessor(eos.JoinTable(table, joinCases), joinOpts(t, brokers, table)...)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		return p, done, stop
	}
	_, done, stop := newProc()
	defer stop()
	waitCommitted(t, ctx, adm, "join", "cases")

	// The topic created again, with every name written four times in
	// version 2: each partition ends past the old one's end.
	recreated := time.Now()
	if _, err := adm.DeleteTopics(ctx, "regions"); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := adm.CreateTopic(ctx, 3, 1, nil, "regions"); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("create the table's topic again: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A client that wrote to the former topic keeps its ID (franz-go
	// v1.22.3 answers UNKNOWN_TOPIC_ID until the produce times out): a new
	// one writes to the new topic.
	seed.Close()
	if seed, err = kgo.NewClient(kgo.SeedBrokers(brokers...)); err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	for range 4 {
		names(2, base.Add(2*time.Minute))
	}
	checkRefused := func(err error) {
		t.Helper()
		var ce *eoskit.ConfigError
		if !errors.As(err, &ce) || ce.Setting != "WithTables" || !strings.Contains(ce.Reason, `"regions"`) {
			t.Fatalf("Run over a table created again: %v, want a ConfigError for WithTables naming the table", err)
		}
		t.Logf("%s: %v", time.Since(recreated).Round(time.Millisecond), err)
	}
	// Cases keep coming, later than every name: the first transactions
	// may still meet the old table (its client learns the topic is gone
	// after a few fetches), none the new one's records.
	deadline := time.After(20 * time.Second)
wait:
	for {
		cases(3, base.Add(3*time.Minute))
		select {
		case err := <-done:
			checkRefused(err)
			break wait
		case <-deadline:
			t.Fatal("Run still runs 20 s after its table was created again")
		case <-time.After(200 * time.Millisecond):
		}
	}
	for _, r := range readCommitted(t, brokers, "joined") {
		if v := string(r.Value); !strings.HasSuffix(v, "/v1") {
			t.Errorf("case %s joined as %q: the old table held v1 for every region, and the new one's records may not mix in", r.Key, v)
		}
	}
	stop()
	_, done, stop = newProc()
	defer stop()
	select {
	case err := <-done:
		checkRefused(err)
	case <-time.After(20 * time.Second):
		t.Error("a processor starting on state of the old table still runs after 20 s")
	}
}
