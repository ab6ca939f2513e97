package leastprivilege_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// The outbox relay runs as an application principal holding only the ACLs
// the README lists for it: Write on the topics its records name, Read and
// Write on its position topic, Write on its transactional id; no cluster
// right. It relays 600 committed records (and none of the rolled-back
// ones) exactly once. Without any one of those ACLs it publishes nothing
// and Run returns the broker's refusal once RetryFor has passed (Read on
// the position topic: from the first start that has a position to read
// back); once the ACL is granted, a new run publishes everything exactly
// once. No log line or error carries the principal's password.
func TestOutboxRelayRunsWithOnlyItsListedACLs(t *testing.T) {
	b := testbed.StartLocalBrokerWithACLs(t)
	k := b.KafkaCluster
	user := testbed.NewUser(t, b.KafkaCluster, "app-outbox")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	type acl struct {
		name string
		acl  *kadm.ACLBuilder
	}
	const readPositions = 1 // the index of Read on the position topic
	grants := func(out, positions, txnID string) []acl {
		return []acl{
			{"Write on topic " + out, kadm.NewACLs().Topics(out).Allow(user.Principal).Operations(kadm.OpWrite)},
			{"Read on topic " + positions, kadm.NewACLs().Topics(positions).Allow(user.Principal).Operations(kadm.OpRead)},
			{"Write on topic " + positions, kadm.NewACLs().Topics(positions).Allow(user.Principal).Operations(kadm.OpWrite)},
			{"Write on transactional id " + txnID, kadm.NewACLs().TransactionalIDs(txnID).Allow(user.Principal).Operations(kadm.OpWrite)},
		}
	}
	grant := func(as ...acl) {
		t.Helper()
		for _, a := range as {
			results, err := k.Admin.CreateACLs(ctx, a.acl)
			for _, r := range results {
				err = errors.Join(err, r.Err)
			}
			if err != nil {
				t.Fatalf("grant %s: %v", a.name, err)
			}
		}
	}
	// relay runs a relay as the principal until every committed record
	// is on out (nil), or Run returns (its error), within 90 s.
	relay := func(bed outboxBed, retryFor time.Duration) error {
		t.Helper()
		logs := &integration.LogBuffer{}
		defer func() { noSecret(t, user.Password, logs.String()) }()
		r, err := outbox.NewRelay(bed.pool, outbox.Brokers(k.Brokers...), outbox.PositionTopic(bed.positions),
			outbox.TransactionalID(bed.txnID), outbox.RetryFor(retryFor), outbox.ClientOptions(user.Opts...),
			outbox.Logger(slog.New(slog.NewTextHandler(logs, nil))))
		if err != nil {
			t.Fatal(err)
		}
		in, err := bed.load.Inputs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		done := func() bool { return len(k.ReadNow(bed.out, kgo.ReadCommitted(), 30*time.Second)) >= len(in.Committed) }
		return runUntil(ctx, t, r.Run, done, func() string {
			return fmt.Sprintf("the relay neither returned nor published %d records", len(in.Committed))
		})
	}
	newBed := func(name string) outboxBed {
		pool := integration.Postgres(t)
		if err := outbox.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		slot, err := outbox.DefaultSlot(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = outbox.DropSlot(context.Background(), pool, slot) })
		bed := outboxBed{pool: pool, out: k.NewTopic(2), positions: k.NewTopic(1), txnID: integration.UniqueName(t, "relay-"+name)}
		if bed.load, err = testbed.NewOutboxLoad(ctx, pool, bed.out); err != nil {
			t.Fatal(err)
		}
		if err := bed.load.Write(ctx, 600, 2, 20); err != nil {
			t.Fatal(err)
		}
		return bed
	}
	verify := func(bed outboxBed) {
		t.Helper()
		in, err := bed.load.Inputs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		k.VerifyInputs(in, bed.out, time.Minute)
	}

	bed := newBed("all")
	grant(grants(bed.out, bed.positions, bed.txnID)...)
	if err := relay(bed, time.Minute); err != nil {
		t.Fatalf("with every listed ACL, Run returned %v", err)
	}
	verify(bed)

	for i := range grants("", "", "") {
		bed := newBed("without")
		as := grants(bed.out, bed.positions, bed.txnID)
		missing := as[i]
		t.Run("without "+missing.name, func(t *testing.T) {
			grant(append(append([]acl{}, as[:i]...), as[i+1:]...)...)
			before := 0
			err := relay(bed, 5*time.Second)
			if err == nil && i == readPositions {
				// A first start reads nothing back (the topic is
				// empty), so it needs no Read; every later one does.
				before = len(k.ReadNow(bed.out, kgo.ReadCommitted(), 30*time.Second))
				if err := bed.load.Write(ctx, 100, 1, 5); err != nil {
					t.Fatal(err)
				}
				err = relay(bed, 5*time.Second)
			}
			if err == nil {
				t.Fatalf("without %s, the relay published everything", missing.name)
			}
			if !errors.Is(err, kerr.TopicAuthorizationFailed) && !errors.Is(err, kerr.TransactionalIDAuthorizationFailed) && !strings.Contains(err.Error(), "AUTHORIZATION_FAILED") {
				t.Fatalf("without %s, Run returned %v; want the broker's refusal", missing.name, err)
			}
			t.Logf("without %s: %v", missing.name, err)
			noSecret(t, user.Password, err.Error())
			if got := len(k.ReadNow(bed.out, kgo.ReadCommitted(), 30*time.Second)); got != before {
				t.Fatalf("without %s, %d records were published; want %d", missing.name, got, before)
			}
			grant(missing)
			if err := relay(bed, time.Minute); err != nil {
				t.Fatalf("once %s was granted, Run returned %v", missing.name, err)
			}
			verify(bed)
		})
	}
}

type outboxBed struct {
	pool                  *pgxpool.Pool
	out, positions, txnID string
	load                  *testbed.OutboxLoad
}
