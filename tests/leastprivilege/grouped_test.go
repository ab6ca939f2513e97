package leastprivilege_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
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

// groupedRun is one run of a grouped count (eos.NewGrouped): a stateful
// run whose inputs are re-keyed through a repartition topic by a second
// processor, in a group and with a transactional id of its own.
type groupedRun struct {
	statefulRun
	repartition string
}

// grants is what docs/least-privilege.md lists for a grouped aggregation:
// the aggregating processor's (a stateful run's), and the re-keying
// processor's: Read on its group, Write on its transactional id, Write on
// the repartition topic (its output) and Read on it (the aggregation's
// input, and the re-keying processor's hanging check).
func (r groupedRun) grants(principal string) []grant {
	return append(r.statefulRun.grants(principal),
		grant{name: "Read on group " + r.group + "-repartition", acl: kadm.NewACLs().Groups(r.group + "-repartition").Allow(principal).Operations(kadm.OpRead),
			want: kerr.GroupAuthorizationFailed},
		grant{name: "Write on transactional id " + r.txnID + "-repartition", acl: kadm.NewACLs().TransactionalIDs(r.txnID + "-repartition").Allow(principal).Operations(kadm.OpWrite),
			want: kerr.TransactionalIDAuthorizationFailed},
		grant{name: "Write on topic " + r.repartition, acl: kadm.NewACLs().Topics(r.repartition).Allow(principal).Operations(kadm.OpWrite),
			want: kerr.TopicAuthorizationFailed},
		grant{name: "Read on topic " + r.repartition, acl: kadm.NewACLs().Topics(r.repartition).Allow(principal).Operations(kadm.OpRead),
			want: kerr.TopicAuthorizationFailed},
	)
}

// A grouped count (eos.NewGrouped: a re-keying processor and an
// aggregating one) runs as an application principal with only its listed
// ACLs, no Create or DescribeConfigs among them, and counts every
// committed input once under its derived key. Without any one of the
// re-keying step's own ACLs (its group, its transactional id, Write or
// Read on the repartition topic), Run returns within 30 s an error
// wrapping the broker's refusal that names the permission; granted, the
// count completes, nothing lost to the refusal.
func groupedUnderACLs(t *testing.T, b *testbed.LocalBroker) {
	k := b.KafkaCluster.For(t) // run as a parallel subtest
	user := testbed.NewUser(t, k, "app-grouped")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	newRun := func(name string) groupedRun {
		r := groupedRun{statefulRun: newStatefulRun(t, k, "g-grouped-"+name, 200, 50), repartition: integration.UniqueName(t, "repartition")}
		k.CreateTopic(r.repartition, 2, nil) // the changelog's partition count
		return r
	}
	// verify reads the updates back: each committed input counted once
	// under its derived key, no aborted one.
	verify := func(r groupedRun) {
		t.Helper()
		counts := map[string]string{}
		for _, rec := range k.ReadAll(r.updates, kgo.ReadCommitted(), time.Minute) {
			counts[string(rec.Key)] = string(rec.Value)
		}
		for _, id := range r.inputs.Committed {
			if counts[groupedKey(id)] != "1" {
				t.Fatalf("input %s counted %q under %s, want 1", id, counts[groupedKey(id)], groupedKey(id))
			}
		}
		for _, id := range r.inputs.Aborted {
			if _, ok := counts[groupedKey(id)]; ok {
				t.Fatalf("aborted input %s counted", id)
			}
		}
	}

	r := newRun("all")
	allow(ctx, t, k.Admin, r.grants(user.Principal)...)
	logs := &integration.LogBuffer{}
	if err := groupAll(ctx, t, k, r, user.Opts, logs); err != nil {
		t.Fatalf("with every listed ACL, Run returned %v; logs:\n%s", err, logs)
	}
	verify(r)

	first := len(r.statefulRun.grants(user.Principal)) // the aggregation's, proven in "eos with keyed state"
	for i, missing := range r.grants(user.Principal)[first:] {
		i += first
		label := strings.NewReplacer("group "+r.group+"-repartition", "the re-keying group", "transactional id "+r.txnID+"-repartition",
			"the re-keying transactional id", "topic "+r.repartition, "the repartition topic").Replace(missing.name)
		t.Run("without "+label, func(t *testing.T) {
			r := newRun(fmt.Sprintf("without-%d", i))
			refusedWithout(ctx, t, k, user, r.grants(user.Principal), i,
				func(logs *integration.LogBuffer) error { return groupAll(ctx, t, k, r, user.Opts, logs) },
				func() { verify(r) },
				func(err error) error { // the refused processor named by its group
					if !strings.Contains(err.Error(), "(group "+r.group) {
						return errors.New("no processor's group named")
					}
					return nil
				})
		})
	}
	t.Run("purging without Delete on the repartition topic", func(t *testing.T) { purgeUnderACLs(ctx, t, k, user, newRun, verify) })
}

// With PurgeRepartition, the principal needs Delete on the repartition
// topic too: without it, Run returns within 30 s (checked at its start:
// 0.15 s seen) an *eoskit.AuthorizationError naming it; granted,
// everything is counted once with the purge on.
func purgeUnderACLs(ctx context.Context, t *testing.T, k *integration.KafkaCluster, user testbed.User, newRun func(string) groupedRun, verify func(groupedRun)) {
	r := newRun("purge")
	gs := append(r.grants(user.Principal), grant{name: "Delete on topic " + r.repartition,
		acl: kadm.NewACLs().Topics(r.repartition).Allow(user.Principal).Operations(kadm.OpDelete), want: kerr.TopicAuthorizationFailed})
	refusedWithout(ctx, t, k, user, gs, len(gs)-1,
		func(logs *integration.LogBuffer) error {
			return groupAll(ctx, t, k, r, user.Opts, logs, eos.PurgeRepartition(200*time.Millisecond))
		},
		func() { verify(r) }, nil)
}

// groupedKey is the key an input is counted under: derived from its own.
func groupedKey(id string) string { return "derived-" + id }

// groupAll runs r's grouped count as the principal of opts until the
// updates topic counts every committed input (nil), or Run returns (its
// error); see runUntil.
func groupAll(ctx context.Context, t *testing.T, k *integration.KafkaCluster, r groupedRun, opts []kgo.Opt, logs *integration.LogBuffer, more ...eos.ProcessorOption) error {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	key := func(rec *kgo.Record) ([]byte, error) { return []byte(groupedKey(string(rec.Key))), nil }
	g, err := eos.NewGrouped(key, r.repartition, eos.Count(), append([]eos.ProcessorOption{eos.Brokers(k.Brokers...), eos.Group(r.group), eos.Topics(r.in),
		eos.TransactionalID(r.txnID), eos.Changelog(r.changelog, eos.EmitUpdates(r.updates)), eos.Logger(logger),
		eos.ClientOptions(append(slices.Clip(opts), kgo.SessionTimeout(6*time.Second), kgo.WithLogger(kslog.New(logger)))...)},
		more...)...)
	if err != nil {
		t.Fatal(err)
	}
	return runUntil(ctx, t, g.Run, r.updatedAll(k), func() string {
		return fmt.Sprintf("a grouped count neither returned nor counted all %d inputs; logs:\n%s", len(r.inputs.Committed), logs)
	})
}
