package leastprivilege_test

import (
	"context"
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

// statefulRun is one run of a stateful processor (eos.Count with its
// changelog and an updates topic).
type statefulRun struct {
	in, changelog, updates, group, txnID string
	inputs                               integration.Inputs
}

// grants is what docs/least-privilege.md lists for a stateful processor:
// the processor's, with the updates topic as its output, and Read and
// Write on its changelog.
func (r statefulRun) grants(principal string) []grant {
	topic := func(t string, op kadm.ACLOperation) *kadm.ACLBuilder {
		return kadm.NewACLs().Topics(t).Allow(principal).Operations(op)
	}
	return []grant{
		{name: "Read on topic " + r.in, acl: topic(r.in, kadm.OpRead)},
		{name: "Read on group " + r.group, acl: kadm.NewACLs().Groups(r.group).Allow(principal).Operations(kadm.OpRead)},
		{name: "Write on transactional id " + r.txnID, acl: kadm.NewACLs().TransactionalIDs(r.txnID).Allow(principal).Operations(kadm.OpWrite)},
		{name: "Write on topic " + r.updates, acl: topic(r.updates, kadm.OpWrite), want: kerr.TopicAuthorizationFailed},
		{name: "Read on topic " + r.updates, acl: topic(r.updates, kadm.OpRead)}, // the hanging check
		{name: "Write on topic " + r.changelog, acl: topic(r.changelog, kadm.OpWrite), want: kerr.TopicAuthorizationFailed},
		{name: "Read on topic " + r.changelog, acl: topic(r.changelog, kadm.OpRead), want: kerr.TopicAuthorizationFailed},
	}
}

// A stateful processor runs as an application principal with only its
// listed ACLs and counts every committed input once. Without Read or
// Write on its changelog (an empty one: the restore reads nothing), Run's
// check refuses it; without Write on its updates topic, the first
// transaction's update records are refused. Either way Run returns
// within 30 s an *eoskit.AuthorizationError wrapping the broker's refusal
// that names the permission, rather than restarting its session until it gives up (or,
// without Read, running until the first restore with state); granted,
// the count completes with every input counted once.
func statefulProcessorUnderACLs(t *testing.T, b *testbed.LocalBroker) {
	k := b.KafkaCluster.For(t) // run as a parallel subtest
	user := testbed.NewUser(t, k, "app-state")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	newRun := func(name string) statefulRun { return newStatefulRun(t, k, "g-state-"+name, 300, 100) }
	// verify reads the updates back: each committed input's id (its key)
	// counted once, no aborted one.
	verify := func(r statefulRun) {
		t.Helper()
		counts := map[string]string{}
		for _, rec := range k.ReadAll(r.updates, kgo.ReadCommitted(), time.Minute) {
			counts[string(rec.Key)] = string(rec.Value)
		}
		for _, id := range r.inputs.Committed {
			if counts[id] != "1" {
				t.Fatalf("input %s counted %q, want 1", id, counts[id])
			}
		}
		for _, id := range r.inputs.Aborted {
			if _, ok := counts[id]; ok {
				t.Fatalf("aborted input %s counted", id)
			}
		}
	}

	r := newRun("all")
	allow(ctx, t, k.Admin, r.grants(user.Principal)...)
	logs := &integration.LogBuffer{}
	if err := countAll(ctx, t, k, r, user.Opts, logs); err != nil {
		t.Fatalf("with every listed ACL, Run returned %v; logs:\n%s", err, logs)
	}
	verify(r)

	for i, missing := range r.grants(user.Principal) {
		if missing.want == nil {
			continue // the processor's own, proven without state above
		}
		label := strings.NewReplacer(r.updates, "the updates topic", r.changelog, "the changelog").Replace(missing.name)
		t.Run("without "+label, func(t *testing.T) {
			r := newRun(fmt.Sprintf("without-%d", i))
			refusedWithout(ctx, t, k, user, r.grants(user.Principal), i,
				func(logs *integration.LogBuffer) error { return countAll(ctx, t, k, r, user.Opts, logs) },
				func() { verify(r) }, nil)
		})
	}
}

// newStatefulRun is a run in group (a unique name made of it) over a
// fresh input of two partitions holding n committed inputs of a
// transactional producer that also aborts (in transactions of batch),
// with fresh updates and changelog topics.
func newStatefulRun(t *testing.T, k *integration.KafkaCluster, group string, n, batch int) statefulRun {
	t.Helper()
	r := statefulRun{in: k.NewTopic(2), updates: k.NewTopic(2), changelog: integration.UniqueName(t, "changelog"),
		group: integration.UniqueName(t, group)}
	compact := "compact"
	k.CreateTopic(r.changelog, 2, map[string]*string{"cleanup.policy": &compact})
	var err error
	if r.txnID, err = eos.StableTransactionalID(r.group, "0"); err != nil {
		t.Fatal(err)
	}
	r.inputs = k.SeedHostile(r.in, n, batch)
	return r
}

// updatedAll reports whether r's updates topic holds, committed, a
// record of every committed input's key.
func (r statefulRun) updatedAll(k *integration.KafkaCluster) func() bool {
	return func() bool {
		keys := map[string]bool{}
		for _, rec := range k.ReadNow(r.updates, kgo.ReadCommitted(), 30*time.Second) {
			keys[string(rec.Key)] = true
		}
		return len(keys) >= len(r.inputs.Committed)
	}
}

// countAll runs r's stateful processor as the principal of opts until the
// updates topic counts every committed input (nil), or Run returns (its
// error); see runUntil.
func countAll(ctx context.Context, t *testing.T, k *integration.KafkaCluster, r statefulRun, opts []kgo.Opt, logs *integration.LogBuffer) error {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := eos.NewProcessor(eos.Count(), eos.Brokers(k.Brokers...), eos.Group(r.group), eos.Topics(r.in),
		eos.TransactionalID(r.txnID), eos.Changelog(r.changelog, eos.EmitUpdates(r.updates)), eos.Logger(logger),
		eos.ClientOptions(append(slices.Clip(opts), kgo.SessionTimeout(6*time.Second), kgo.WithLogger(kslog.New(logger)))...))
	if err != nil {
		t.Fatal(err)
	}
	return runUntil(ctx, t, p.Run, r.updatedAll(k), func() string {
		return fmt.Sprintf("a stateful processor neither returned nor counted all %d inputs; logs:\n%s", len(r.inputs.Committed), logs)
	})
}
