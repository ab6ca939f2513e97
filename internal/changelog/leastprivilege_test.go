package changelog_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/changelog"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// An application's account has Read and Write (which imply Describe) on
// its changelog, not DescribeConfigs: Check passes with a warning that it
// could not verify the cleanup policy, unless the configs are required;
// Restore needs Read only. With no ACL at all, a restore fails at once,
// naming what to grant, rather than at its deadline; with Read only,
// Check names Write (each transaction writes the changelog).
func TestLeastPrivilegeChangelogNeedsOnlyRead(t *testing.T) {
	b := testbed.StartLocalBrokerWithACLs(t)
	k := b.KafkaCluster
	topic := newChangelog(t, k)
	w := newWriter(t, k, topic)
	w.txn(5, 10, true)
	w.txn(5, 10, false)
	user := testbed.NewUser(t, k, "app")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// No ACL: refused at once, naming the grant.
	r := restorer(t, user.Opts...)
	start := time.Now()
	_, err := r.Restore(ctx, topic, 0, state.NewMemory(), changelog.Options{Timeout: time.Minute, Logger: quiet()})
	if ae, ok := errors.AsType[*eoskit.AuthorizationError](err); !ok || ae.Permission != "Read on topic "+topic || time.Since(start) > 20*time.Second {
		t.Fatalf("restore without ACLs: %v after %s, want an *eoskit.AuthorizationError naming Read on %s within seconds", err, time.Since(start), topic)
	}

	grant := func(op kadm.ACLOperation) {
		t.Helper()
		results, err := k.Admin.CreateACLs(ctx, kadm.NewACLs().Topics(topic).Allow(user.Principal).Operations(op))
		if err == nil {
			for _, res := range results {
				err = errors.Join(err, res.Err)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// until is Check's answer once it satisfies done: an ACL reaches
	// the broker through its metadata log.
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	until := func(done func(error) bool) (changelog.Shape, error) {
		for {
			sh, err := changelog.Check(ctx, user.Opts, topic, partitions, changelog.CheckOptions{Logger: logger})
			if done(err) || ctx.Err() != nil {
				return sh, err
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	grant(kadm.OpRead)
	_, err = until(func(err error) bool {
		ae, ok := errors.AsType[*eoskit.AuthorizationError](err)
		return ok && ae.Permission == "Write on topic "+topic
	})
	if ae, ok := errors.AsType[*eoskit.AuthorizationError](err); !ok || ae.Permission != "Write on topic "+topic || !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("Check with Read only: %v, want an *eoskit.AuthorizationError naming Write on %s", err, topic)
	}
	grant(kadm.OpWrite)
	sh, err := until(func(err error) bool { return err == nil })
	if err != nil || sh.ConfigsRead || sh.MaxMessageBytes != changelog.DefaultMaxMessageBytes {
		t.Fatalf("Check with Read only: %+v, %v", sh, err)
	}
	if !strings.Contains(logs.String(), "DescribeConfigs") || !strings.Contains(logs.String(), topic) {
		t.Fatalf("no warning naming DescribeConfigs and the topic: %s", logs.String())
	}
	_, err = changelog.Check(ctx, user.Opts, topic, partitions, changelog.CheckOptions{RequireConfigs: true, Logger: quiet()})
	if ae, ok := errors.AsType[*eoskit.AuthorizationError](err); !ok || ae.Permission != "DescribeConfigs on topic "+topic || !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("Check requiring the configs: %v", err)
	}

	// A new restorer: the first one's client keeps the topic's refused
	// metadata for a while (a runner whose restore was refused ends Run,
	// and its next Run makes a new one).
	r = restorer(t, user.Opts...)
	s := state.NewMemory()
	if _, err := r.Restore(ctx, topic, 2, s, changelog.Options{Timeout: time.Minute, Logger: quiet()}); err != nil {
		t.Fatalf("restore with Read: %v", err)
	}
	if got := contents(t, s); !maps.Equal(got, w.want[2]) {
		t.Fatalf("restored %v, want %v", got, w.want[2])
	}
}
