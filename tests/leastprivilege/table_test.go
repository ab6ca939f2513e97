package leastprivilege_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// A processor joining a co-partitioned table (eos.JoinTable) runs as an
// application principal with its stateful grants and Read on the table's
// topic (docs/least-privilege.md), and joins every committed input once,
// with the table's value of its key; without any ACL on the table's
// topic, Run returns within 30 s an *eoskit.AuthorizationError wrapping
// the broker's refusal that names the topic, and once Read is granted it
// joins everything, nothing lost to the refusal.
func tableJoinUnderACLs(t *testing.T, b *testbed.LocalBroker) {
	k := b.KafkaCluster.For(t) // run as a parallel subtest
	user := testbed.NewUser(t, k, "app-join")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	compact := "compact"
	newRun := func(name string) (statefulRun, string) {
		r := newStatefulRun(t, k, "g-join-"+name, 200, 50)
		table := integration.UniqueName(t, "table")
		k.CreateTopic(table, 2, map[string]*string{"cleanup.policy": &compact})
		// Every other committed input's key named in the table, an hour
		// before the inputs: every input meets it.
		cl := k.Client(kgo.DefaultProduceTopic(table))
		defer cl.Close()
		for i, id := range r.inputs.Committed {
			if i%2 == 0 {
				if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(id), Value: []byte("named-" + id), Timestamp: time.Now().Add(-time.Hour)}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
		}
		return r, table
	}
	grants := func(r statefulRun, table string) []grant {
		return append(r.grants(user.Principal), grant{name: "Read on topic " + table,
			acl: kadm.NewACLs().Topics(table).Allow(user.Principal).Operations(kadm.OpRead), want: kerr.TopicAuthorizationFailed,
			named: table}) // refused as "Describe (or Read or Write) on topics [table]"
	}
	verify := func(r statefulRun) {
		t.Helper()
		joined := map[string]string{}
		for _, rec := range k.ReadAll(r.updates, kgo.ReadCommitted(), time.Minute) {
			if prev, dup := joined[string(rec.Key)]; dup {
				t.Fatalf("input %s joined twice (%q, %q)", rec.Key, prev, rec.Value)
			}
			joined[string(rec.Key)] = string(rec.Value)
		}
		for i, id := range r.inputs.Committed {
			want := "-"
			if i%2 == 0 {
				want = "named-" + id
			}
			if joined[id] != want {
				t.Fatalf("input %s joined as %q, want %q", id, joined[id], want)
			}
		}
		for _, id := range r.inputs.Aborted {
			if _, ok := joined[id]; ok {
				t.Fatalf("aborted input %s joined", id)
			}
		}
	}

	r, table := newRun("all")
	allow(ctx, t, k.Admin, grants(r, table)...)
	logs := &integration.LogBuffer{}
	if err := joinAll(ctx, t, k, r, table, user.Opts, logs); err != nil {
		t.Fatalf("with every listed ACL, Run returned %v; logs:\n%s", err, logs)
	}
	verify(r)

	t.Run("without Read on the table", func(t *testing.T) {
		r, table := newRun("no-table")
		gs := grants(r, table)
		refusedWithout(ctx, t, k, user, gs, len(gs)-1,
			func(logs *integration.LogBuffer) error { return joinAll(ctx, t, k, r, table, user.Opts, logs) },
			func() { verify(r) }, nil)
	})
}

// joinAll runs r's processor, joining its input with table and writing
// each joined input to the updates topic, as the principal of opts, until
// every committed input was joined (nil), or Run returns (its error); see
// runUntil.
func joinAll(ctx context.Context, t *testing.T, k *integration.KafkaCluster, r statefulRun, table string, opts []kgo.Opt, logs *integration.LogBuffer) error {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tbl := eos.NewTable(table)
	join := eos.JoinTable(tbl, func(_ context.Context, rec *kgo.Record, value []byte, ok bool) ([]*kgo.Record, error) {
		v := []byte("-")
		if ok {
			v = value
		}
		return []*kgo.Record{{Topic: r.updates, Key: rec.Key, Value: v}}, nil
	})
	p, err := eos.NewProcessor(join, eos.Brokers(k.Brokers...), eos.Group(r.group), eos.Topics(r.in),
		eos.TransactionalID(r.txnID), eos.Changelog(r.changelog), eos.WithTables(tbl), eos.Logger(logger),
		eos.ClientOptions(append(slices.Clip(opts), kgo.SessionTimeout(6*time.Second), kgo.WithLogger(kslog.New(logger)))...))
	if err != nil {
		t.Fatal(err)
	}
	return runUntil(ctx, t, p.Run, r.updatedAll(k), func() string {
		return fmt.Sprintf("a joining processor neither returned nor joined all %d inputs; logs:\n%s", len(r.inputs.Committed), logs)
	})
}
