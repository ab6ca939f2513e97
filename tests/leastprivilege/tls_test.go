package leastprivilege_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/testsupport/testbed"
	"github.com/eoskit/eoskit/verify"
)

// Each exactly-once path as an application principal on a SASL_SSL
// listener (SCRAM-SHA-512 over TLS, as managed clusters run it), trusting
// the broker's CA alone and checking its host name: every input once,
// and no password in a log line. Then what a misconfigured client meets,
// each an error within 30 s that names the cause, not a stall: a CA that
// did not sign the broker's certificate, and a wrong password.
func TestEachPathOverTLS(t *testing.T) {
	b := testbed.StartLocalBrokerWithTLS(t)
	k := b.KafkaCluster
	pool := integration.Postgres(t)
	trusted := kgo.DialTLSConfig(testbed.TLSConfig(t, b.CAFile()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	newSetup := func(t *testing.T, path, principal string) (setup, integration.Inputs) {
		return newPathSetup(ctx, t, k, pool, path, "tls", principal, 300)
	}
	for _, path := range []string{"eos", "offsetstore", "dedup"} {
		t.Run(path, func(t *testing.T) {
			user := testbed.NewUser(t, k, "tls-"+path, trusted)
			s, inputs := newSetup(t, path, user.Principal)
			allow(ctx, t, k.Admin, s.grants()...)
			logs := &integration.LogBuffer{}
			if err := copyAll(ctx, t, k, pool, s, user.Opts, logs, len(inputs.Committed), ""); err != nil {
				t.Fatalf("over TLS, Run returned %v; logs:\n%s", err, logs)
			}
			if path == "eos" {
				k.VerifyInputs(inputs, s.out, time.Minute)
			} else {
				outs, err := verify.ReadRows(ctx, pool, s.table)
				if err != nil {
					t.Fatal(err)
				}
				if err := verify.Check(verify.Run{Input: inputs.Committed, Output: outs, AbortedInput: inputs.Aborted}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			noSecret(t, user.Password, logs.String())
		})
	}
	t.Run("outbox", func(t *testing.T) {
		user := testbed.NewUser(t, k, "tls-outbox", trusted)
		relayOverTLS(ctx, t, k, user, user.Opts, "")
	})
	t.Run("outbox trusting a CA that did not sign the broker's certificate", func(t *testing.T) {
		user := testbed.NewUser(t, k, "tls-outbox-wrong-ca", trusted)
		relayOverTLS(ctx, t, k, user, append(user.Opts[:len(user.Opts):len(user.Opts)], kgo.DialTLSConfig(foreignCA(t))), "certificate signed by unknown authority")
	})
	t.Run("outbox with a wrong password", func(t *testing.T) {
		user := testbed.NewUser(t, k, "tls-outbox-wrong-password", trusted)
		relayOverTLS(ctx, t, k, user, []kgo.Opt{kgo.SeedBrokers(k.Brokers...), trusted, scramSHA512("tls-outbox-wrong-password", user.Password+"x")}, "SASL_AUTHENTICATION_FAILED")
	})
	refusedWith := func(t *testing.T, path string, opts []kgo.Opt, password string, want ...string) {
		t.Helper()
		s, inputs := newSetup(t, path, "User:admin")
		logs := &integration.LogBuffer{}
		start := time.Now()
		err := copyAll(ctx, t, k, pool, s, opts, logs, len(inputs.Committed), "")
		took := time.Since(start)
		switch {
		case err == nil:
			t.Fatal("Run copied everything")
		case took > 30*time.Second:
			t.Fatalf("Run took %s to return %v; want it within 30 s", took, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("Run returned %v; want an error naming %q", err, w)
			}
		}
		t.Logf("refused in %s: %v", took.Round(time.Millisecond), err)
		noSecret(t, password, err.Error())
		noSecret(t, password, logs.String())
	}
	for _, path := range []string{"eos", "offsetstore", "dedup"} {
		t.Run(path+" trusting a CA that did not sign the broker's certificate", func(t *testing.T) {
			user := testbed.NewUser(t, k, "tls-wrong-ca-"+path, trusted)
			opts := append(user.Opts[:len(user.Opts):len(user.Opts)], kgo.DialTLSConfig(foreignCA(t)))
			refusedWith(t, path, opts, user.Password, "certificate signed by unknown authority", "ClientOptions")
		})
		t.Run(path+" with a wrong password", func(t *testing.T) {
			name := "tls-wrong-password-" + path
			user := testbed.NewUser(t, k, name, trusted)
			opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...), trusted, scramSHA512(name, user.Password+"x")}
			refusedWith(t, path, opts, user.Password, "SASL_AUTHENTICATION_FAILED", "ClientOptions")
		})
	}
}

// scramSHA512 signs in as user with pass.
func scramSHA512(user, pass string) kgo.Opt {
	return kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism())
}

// relayOverTLS runs an outbox relay as user, with its ACLs, connecting
// with opts, over 300 committed records: with refusal "", every one
// published once; else Run must return within 30 s an error naming
// refusal. No log line or error carries the password.
func relayOverTLS(ctx context.Context, t *testing.T, k *integration.KafkaCluster, user testbed.User, opts []kgo.Opt, refusal string) {
	t.Helper()
	pool := integration.Postgres(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	slot, err := outbox.DefaultSlot(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = outbox.DropSlot(context.Background(), pool, slot) })
	out, positions, txnID := k.NewTopic(2), k.NewTopic(1), integration.UniqueName(t, "relay")
	for _, acl := range []*kadm.ACLBuilder{
		kadm.NewACLs().Topics(out).Allow(user.Principal).Operations(kadm.OpWrite),
		kadm.NewACLs().Topics(positions).Allow(user.Principal).Operations(kadm.OpRead, kadm.OpWrite),
		kadm.NewACLs().TransactionalIDs(txnID).Allow(user.Principal).Operations(kadm.OpWrite),
	} {
		results, err := k.Admin.CreateACLs(ctx, acl)
		for _, r := range results {
			err = errors.Join(err, r.Err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	load, err := testbed.NewOutboxLoad(ctx, pool, out)
	if err != nil {
		t.Fatal(err)
	}
	if err := load.Write(ctx, 300, 2, 20); err != nil {
		t.Fatal(err)
	}
	in, err := load.Inputs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	logs := &integration.LogBuffer{}
	defer func() { noSecret(t, user.Password, logs.String()) }()
	r, err := outbox.NewRelay(pool, outbox.Brokers(k.Brokers...), outbox.PositionTopic(positions), outbox.TransactionalID(txnID),
		outbox.RetryFor(time.Minute), outbox.ClientOptions(opts...), outbox.Logger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = runUntil(ctx, t, r.Run, func() bool { return len(k.ReadNow(out, kgo.ReadCommitted(), 30*time.Second)) >= len(in.Committed) },
		func() string {
			return fmt.Sprintf("the relay neither returned nor published %d records", len(in.Committed))
		})
	switch {
	case refusal == "" && err != nil:
		t.Fatalf("over TLS, the relay returned %v", err)
	case refusal == "":
		k.VerifyInputs(in, out, time.Minute)
	case err == nil || !strings.Contains(err.Error(), refusal) || !strings.Contains(err.Error(), "ClientOptions") || time.Since(start) > 30*time.Second:
		t.Fatalf("the relay returned %v after %s; want, within 30 s, a configuration error naming ClientOptions and %q", err, time.Since(start), refusal)
	default:
		noSecret(t, user.Password, err.Error())
	}
}

// foreignCA trusts a CA that signed nothing the broker presents.
func foreignCA(t *testing.T) *tls.Config {
	cfg, _ := testbed.ForeignCA(t)
	return cfg
}
