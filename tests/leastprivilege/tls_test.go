package leastprivilege_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/testsupport/testbed"
	"github.com/eoskit/eoskit/verify"
)

// Each exactly-once path as an application principal on a SASL_SSL
// listener (SCRAM-SHA-512 over TLS, as managed clusters run it), trusting
// the broker's CA alone and checking its host name, and with a PostgreSQL
// that takes connections over TLS only (sslmode=verify-full, the outbox
// relay's replication connection included): every input once, and no
// password in a log line; the same over mutual TLS (a client certificate)
// and OAUTHBEARER (a signed JWT). Then what a misconfigured client meets,
// each an error within 30 s that names the cause, not a stall: a CA that
// did not sign the broker's certificate, or the database's, a wrong
// password, no client certificate, and a token signed by another key,
// expired, or for another audience or issuer.
func TestEachPathOverTLS(t *testing.T) {
	b := testbed.StartLocalBrokerWithTLS(t)
	k := b.KafkaCluster
	pg := testbed.StartPrivatePostgresWithTLS(t)
	pool, dbURL := pg.Database(t)
	trusted := kgo.DialTLSConfig(testbed.TLSConfig(t, b.CAFile()))
	// The subtests side by side (four at a time): their runs wait on the
	// broker, the database and refusals far more than on the CPU. They
	// run once this function has returned.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	newSetup := func(t *testing.T, k *integration.KafkaCluster, path, principal string) (setup, integration.Inputs) {
		return newPathSetup(ctx, t, k, pool, path, "tls", principal, 300)
	}
	for _, path := range []string{"eos", "offsetstore", "dedup"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			k := k.For(t)
			user := testbed.NewUser(t, k, "tls-"+path, trusted)
			s, inputs := newSetup(t, k, path, user.Principal)
			logs := copiesEachOnce(ctx, t, k, pool, s, inputs, user.Opts)
			noSecret(t, user.Password, logs.String())
		})
	}
	// Mutual TLS: a client certificate the broker's CA signed instead of
	// a password; the principal is the certificate's subject.
	mtlsBrokers, mtlsConfig, mtlsPrincipal := b.MutualTLS(t)
	mtls := []kgo.Opt{kgo.SeedBrokers(mtlsBrokers...), kgo.DialTLSConfig(mtlsConfig)}
	for _, path := range []string{"eos", "offsetstore", "dedup"} {
		t.Run(path+" over mutual TLS", func(t *testing.T) {
			t.Parallel()
			k := k.For(t)
			s, inputs := newSetup(t, k, path, mtlsPrincipal)
			s.brokers = mtlsBrokers
			copiesEachOnce(ctx, t, k, pool, s, inputs, mtls)
		})
	}
	// OAUTHBEARER: a JWT signed by the key the broker trusts, for its
	// issuer and audience; its sub claim is the principal.
	oauthOpts := func(token string) []kgo.Opt {
		return []kgo.Opt{kgo.SeedBrokers(k.Brokers...), trusted, kgo.SASL(oauth.Auth{Token: token}.AsMechanism())}
	}
	for _, path := range []string{"eos", "offsetstore", "dedup"} {
		t.Run(path+" over OAUTHBEARER", func(t *testing.T) {
			t.Parallel()
			k := k.For(t)
			sub := "oauth-" + path
			s, inputs := newSetup(t, k, path, "User:"+sub)
			token := testbed.SignOAuth(t, b.OAuthKey(t), b.OAuthClaims(t, sub))
			logs := copiesEachOnce(ctx, t, k, pool, s, inputs, oauthOpts(token))
			noSecret(t, token, logs.String())
		})
	}
	t.Run("outbox over OAUTHBEARER", func(t *testing.T) {
		t.Parallel()
		k := k.For(t)
		db, _ := pg.Database(t)
		token := testbed.SignOAuth(t, b.OAuthKey(t), b.OAuthClaims(t, "oauth-outbox"))
		relayOverTLS(ctx, t, k, db, testbed.User{Principal: "User:oauth-outbox", Opts: oauthOpts(token)}, k.Brokers, oauthOpts(token), "")
	})
	t.Run("outbox over mutual TLS", func(t *testing.T) {
		t.Parallel()
		k := k.For(t)
		db, _ := pg.Database(t)
		relayOverTLS(ctx, t, k, db, testbed.User{Principal: mtlsPrincipal, Opts: mtls}, mtlsBrokers, mtls, "")
	})
	t.Run("outbox", func(t *testing.T) {
		t.Parallel()
		k := k.For(t)
		user := testbed.NewUser(t, k, "tls-outbox", trusted)
		db, _ := pg.Database(t)
		relayOverTLS(ctx, t, k, db, user, k.Brokers, user.Opts, "")
	})
	t.Run("outbox trusting a CA that did not sign the broker's certificate", func(t *testing.T) {
		t.Parallel()
		k := k.For(t)
		user := testbed.NewUser(t, k, "tls-outbox-wrong-ca", trusted)
		db, _ := pg.Database(t)
		relayOverTLS(ctx, t, k, db, user, k.Brokers, append(user.Opts[:len(user.Opts):len(user.Opts)], kgo.DialTLSConfig(foreignCA(t))), "certificate signed by unknown authority")
	})
	t.Run("outbox with a wrong password", func(t *testing.T) {
		t.Parallel()
		k := k.For(t)
		user := testbed.NewUser(t, k, "tls-outbox-wrong-password", trusted)
		db, _ := pg.Database(t)
		relayOverTLS(ctx, t, k, db, user, k.Brokers, []kgo.Opt{kgo.SeedBrokers(k.Brokers...), trusted, scramSHA512("tls-outbox-wrong-password", user.Password+"x")}, "SASL_AUTHENTICATION_FAILED")
	})
	refusedWith := func(t *testing.T, k *integration.KafkaCluster, path string, brokers []string, opts []kgo.Opt, password string, want ...string) {
		t.Helper()
		s, inputs := newSetup(t, k, path, "User:admin")
		s.brokers = brokers
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
			t.Parallel()
			k := k.For(t)
			user := testbed.NewUser(t, k, "tls-wrong-ca-"+path, trusted)
			opts := append(user.Opts[:len(user.Opts):len(user.Opts)], kgo.DialTLSConfig(foreignCA(t)))
			refusedWith(t, k, path, nil, opts, user.Password, "certificate signed by unknown authority", "ClientOptions")
		})
		t.Run(path+" with a wrong password", func(t *testing.T) {
			t.Parallel()
			k := k.For(t)
			name := "tls-wrong-password-" + path
			user := testbed.NewUser(t, k, name, trusted)
			opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...), trusted, scramSHA512(name, user.Password+"x")}
			refusedWith(t, k, path, nil, opts, user.Password, "SASL_AUTHENTICATION_FAILED", "ClientOptions")
		})
	}
	// Tokens the broker must refuse, each otherwise valid and for the
	// super user: a sub claim alone proves nothing.
	foreignKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  *rsa.PrivateKey
		edit func(*testbed.OAuthClaims)
	}{
		{"signed by a key the broker does not trust (under its key id)", foreignKey, func(*testbed.OAuthClaims) {}},
		{"expired", nil, func(c *testbed.OAuthClaims) { c.Expiry = time.Now().Add(-time.Minute) }},
		{"for another audience", nil, func(c *testbed.OAuthClaims) { c.Audience = "another-service" }},
		{"from another issuer", nil, func(c *testbed.OAuthClaims) { c.Issuer = "another-issuer" }},
	} {
		t.Run("eos with an OAUTHBEARER token "+tc.name, func(t *testing.T) {
			t.Parallel()
			k := k.For(t)
			key := tc.key
			if key == nil {
				key = b.OAuthKey(t)
			}
			claims := b.OAuthClaims(t, "admin")
			tc.edit(&claims)
			token := testbed.SignOAuth(t, key, claims)
			refusedWith(t, k, "eos", nil, oauthOpts(token), token, "SASL_AUTHENTICATION_FAILED", "ClientOptions")
		})
	}
	t.Run("eos over mutual TLS without a certificate", func(t *testing.T) {
		t.Parallel()
		k := k.For(t)
		noCert := []kgo.Opt{kgo.SeedBrokers(mtlsBrokers...), trusted}
		refusedWith(t, k, "eos", mtlsBrokers, noCert, "", "tls: ", "ClientOptions")
	})
	_, foreignCAFile := testbed.ForeignCA(t)
	foreign := withQuery(t, dbURL, "sslrootcert", foreignCAFile)
	for _, path := range []string{"offsetstore", "dedup", "outbox"} {
		t.Run(path+" trusting a CA that did not sign the database's certificate", func(t *testing.T) {
			t.Parallel()
			k := k.For(t)
			runnerPool, err := pgxpool.New(ctx, foreign)
			if err != nil {
				t.Fatal(err)
			}
			defer runnerPool.Close()
			user := testbed.NewUser(t, k, "tls-db-"+path, trusted)
			allowEverything(ctx, t, k, user.Principal)
			start := time.Now()
			err = runOnDatabase(ctx, t, k, pool, runnerPool, path, user.Opts)
			var cfgErr *eoskit.ConfigError
			if !errors.As(err, &cfgErr) || cfgErr.Setting != "pool" || !strings.Contains(err.Error(), "certificate signed by unknown authority") || time.Since(start) > 30*time.Second {
				t.Fatalf("%s with a database whose certificate it cannot verify returned %v after %s; want, within 30 s, a *eoskit.ConfigError naming the pool and the certificate", path, err, time.Since(start))
			}
			t.Logf("refused in %s: %v", time.Since(start).Round(time.Millisecond), err)
		})
	}
}

// withQuery returns rawURL with its query parameter key set to value.
func withQuery(t *testing.T, rawURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// allowEverything grants principal every operation on every topic, group
// and transactional id: the tests that use it are about the database.
func allowEverything(ctx context.Context, t *testing.T, k *integration.KafkaCluster, principal string) {
	t.Helper()
	results, err := k.Admin.CreateACLs(ctx, kadm.NewACLs().Topics("*").Groups("*").TransactionalIDs("*").
		Allow(principal).Operations(kadm.OpAll))
	for _, r := range results {
		err = errors.Join(err, r.Err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// runOnDatabase runs path's runner, connecting to Kafka with opts, with
// its database connections from runnerPool (set up through pool), until
// it returns or 60 s pass, and returns what Run returned.
func runOnDatabase(ctx context.Context, t *testing.T, k *integration.KafkaCluster, pool, runnerPool *pgxpool.Pool, path string, opts []kgo.Opt) error {
	t.Helper()
	in := k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	var run func(context.Context) error
	switch path {
	case "offsetstore":
		if err := offsetstore.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		r, err := offsetstore.NewRunner(runnerPool, func(context.Context, pgx.Tx, []*kgo.Record) error { return nil },
			offsetstore.Brokers(k.Brokers...), offsetstore.Group(group), offsetstore.Topics(in), offsetstore.ClientOptions(opts...))
		if err != nil {
			t.Fatal(err)
		}
		run = r.Run
	case "dedup":
		store, err := dedup.NewPostgresStore("tls_refused_ids")
		if err != nil {
			t.Fatal(err)
		}
		c, err := dedup.NewConsumer(runnerPool, store, func(context.Context, pgx.Tx, *kgo.Record) error { return nil },
			dedup.Brokers(k.Brokers...), dedup.Group(group), dedup.Topics(in), dedup.ClientOptions(opts...))
		if err != nil {
			t.Fatal(err)
		}
		run = c.Run
	case "outbox":
		r, err := outbox.NewRelay(runnerPool, outbox.Brokers(k.Brokers...), outbox.PositionTopic(k.NewTopic(1)),
			outbox.TransactionalID(integration.UniqueName(t, "relay")), outbox.ClientOptions(opts...))
		if err != nil {
			t.Fatal(err)
		}
		run = r.Run
	}
	runCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return run(runCtx)
}

// scramSHA512 signs in as user with pass.
func scramSHA512(user, pass string) kgo.Opt {
	return kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism())
}

// relayOverTLS runs an outbox relay as user, with its ACLs, connecting
// with opts, over 300 committed records: with refusal "", every one
// published once; else Run must return within 30 s an error naming
// refusal. No log line or error carries the password.
func relayOverTLS(ctx context.Context, t *testing.T, k *integration.KafkaCluster, pool *pgxpool.Pool, user testbed.User, brokers []string, opts []kgo.Opt, refusal string) {
	t.Helper()
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
	r, err := outbox.NewRelay(pool, outbox.Brokers(brokers...), outbox.PositionTopic(positions), outbox.TransactionalID(txnID),
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

// copiesEachOnce grants s's principal its ACLs, runs its path connecting
// with opts until every input is handled, checks each committed input is
// in the output once (and no aborted one), and returns the run's logs.
func copiesEachOnce(ctx context.Context, t *testing.T, k *integration.KafkaCluster, pool *pgxpool.Pool, s setup, inputs integration.Inputs, opts []kgo.Opt) *integration.LogBuffer {
	t.Helper()
	allow(ctx, t, k.Admin, s.grants()...)
	logs := &integration.LogBuffer{}
	if err := copyAll(ctx, t, k, pool, s, opts, logs, len(inputs.Committed), ""); err != nil {
		t.Fatalf("Run returned %v; logs:\n%s", err, logs)
	}
	if s.path == "eos" {
		k.VerifyInputs(inputs, s.out, time.Minute)
		return logs
	}
	outs, err := verify.ReadRows(ctx, pool, s.table)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify.Check(verify.Run{Input: inputs.Committed, Output: outs, AbortedInput: inputs.Aborted}).Err(); err != nil {
		t.Fatal(err)
	}
	return logs
}
