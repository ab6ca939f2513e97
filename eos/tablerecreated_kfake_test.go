package eos_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// recreatedBed is where tableCreatedAgain runs: a cluster, its topics
// (cases, regions and joined of three partitions), the group, and the
// joining processor's options.
type recreatedBed struct {
	brokers                []string
	cases, regions, joined string
	group                  string
	opts                   func(table *eos.Table) []eos.ProcessorOption
}

// A table topic deleted and created again while a processor follows it,
// on kfake; recreated_test.go runs it on the real broker under each
// rebalance protocol.
func TestATableCreatedAgainIsRefusedNotMixed(t *testing.T) {
	t.Parallel()
	brokers, _ := joinCluster(t, "cases", "regions", "joined", "dead")
	tableCreatedAgain(t, recreatedBed{brokers: brokers, cases: "cases", regions: "regions", joined: "joined", group: "join",
		opts: func(table *eos.Table) []eos.ProcessorOption { return joinOpts(t, brokers, table) }})
}

// tableCreatedAgain: a table topic deleted and created again while a
// processor follows it, the new topic holding more records than the old
// (so that its end lies past the position the keyed state holds, and
// offsets alone cannot tell the topics apart). Partitions 0 and 1 of the
// input had cases before; partition 2 meets the table only after (its
// buffer starts on the gone topic, stalls, and the session restarts with
// a new client, which fetches the new topic). No case is joined with the
// new topic's records taken from the old one's position on (a table that
// never was); Run ends within 30 s with a *eoskit.ConfigError naming the
// table, and so does a second processor starting on that state. Before
// the fix, both ran on, joining every later case with the old table or
// the new topic's tail.
func tableCreatedAgain(t *testing.T, b recreatedBed) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seed, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { seed.Close() }()
	admCl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl) // seed is replaced below
	base := time.Now().Add(-time.Hour)
	// names writes every region's name, version v, at time at.
	names := func(v int, at time.Time) {
		t.Helper()
		var rs []*kgo.Record
		for k := range 10 {
			rs = append(rs, &kgo.Record{Topic: b.regions, Key: fmt.Appendf(nil, "r%d", k), Value: fmt.Appendf(nil, "v%d", v), Timestamp: at})
		}
		if err := seed.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// cases writes a case of every region whose partition of three
	// (murmur2, the producer's and the table's) is one of ps, at time at.
	partitioner := kgo.StickyKeyPartitioner(nil).ForTopic(b.cases)
	cases := func(at time.Time, ps ...int) {
		t.Helper()
		var rs []*kgo.Record
		for k := range 10 {
			r := &kgo.Record{Topic: b.cases, Key: fmt.Appendf(nil, "r%d", k), Timestamp: at}
			for _, p := range ps {
				if partitioner.Partition(r, 3) == p {
					rs = append(rs, r)
				}
			}
		}
		if err := seed.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	names(1, base)
	cases(base.Add(time.Minute), 0, 1)

	table := eos.NewTable(b.regions, eos.TableRestoreTimeout(2*time.Second))
	start := func() (chan error, context.CancelFunc) {
		p, err := eos.NewProcessor(eos.JoinTable(table, joinCasesTo(b.joined)), b.opts(table)...)
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(runCtx) }()
		return done, stop
	}
	// refused waits up to 30 s, writing cases of every partition, for
	// Run to end with the ConfigError, and returns it.
	refused := func(done chan error, stop context.CancelFunc) error {
		t.Helper()
		defer stop()
		deadline := time.After(30 * time.Second)
		for {
			cases(base.Add(3*time.Minute), 0, 1, 2)
			select {
			case err := <-done:
				var ce *eoskit.ConfigError
				if !errors.As(err, &ce) || ce.Setting != "WithTables" || ce.Semantics != "exactly-once" || !strings.Contains(ce.Reason, fmt.Sprintf("%q", b.regions)) {
					t.Fatalf("Run over a table created again: %v, want a ConfigError for WithTables naming the table, checked against exactly-once", err)
				}
				return err
			case <-deadline:
				stop()
				select {
				case err := <-done:
					t.Fatalf("Run still runs 30 s after its table was created again (it returned %v once stopped)", err)
				case <-time.After(30 * time.Second):
					t.Fatal("Run still runs 30 s after its table was created again, and 30 s after its stop")
				}
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	done, stop := start()
	waitCommitted(t, ctx, adm, b.group, b.cases)

	// The topic created again, with every name written four times in
	// version 2: each partition ends past the old one's end.
	recreated := time.Now()
	if _, err := adm.DeleteTopics(ctx, b.regions); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := adm.CreateTopic(ctx, 3, 1, nil, b.regions); err == nil {
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
	if seed, err = kgo.NewClient(kgo.SeedBrokers(b.brokers...)); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		names(2, base.Add(2*time.Minute))
	}
	err = refused(done, stop)
	t.Logf("the running processor, %s after the topic was created again: %v", time.Since(recreated).Round(time.Millisecond), err)
	// Cases may have met the old table before Run learnt it was gone,
	// none the new topic's records.
	for _, r := range readCommitted(t, b.brokers, b.joined) {
		if v := string(r.Value); !strings.HasSuffix(v, "/v1") {
			t.Errorf("case %s joined as %q: the old table held v1 for every region, and the new one's records may not mix in", r.Key, v)
		}
	}

	// A processor starting on the state the first left.
	began := time.Now()
	err = refused(start())
	if !strings.Contains(err.Error(), "keyed state") {
		t.Fatalf("a processor starting on the old table's state: %v, want it refused for the ID its state holds", err)
	}
	t.Logf("a processor starting on that state, after %s: %v", time.Since(began).Round(time.Millisecond), err)
}
