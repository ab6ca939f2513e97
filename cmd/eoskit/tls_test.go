package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// The operator's command over SASL_SSL, given a Kafka client properties
// file as Kafka's tools take it (SCRAM-SHA-512, a PEM truststore, the
// host name checked): find-hanging answers, as an application principal
// with Read and Describe. Given a CA that did not sign the broker's
// certificate it fails within seconds, naming the cause (before, it
// waited out -timeout); the password is in no output. The same with
// OAUTHBEARER, the token in a file: a signed one answers, an expired one
// is refused within seconds.
func TestCommandOverTLSWithACommandConfig(t *testing.T) {
	b := testbed.StartLocalBrokerWithTLS(t)
	k := b.KafkaCluster
	user := testbed.NewUser(t, k, "operator", kgo.DialTLSConfig(testbed.TLSConfig(t, b.CAFile())))
	ctx := context.Background()
	for _, acl := range []*kadm.ACLBuilder{
		kadm.NewACLs().Topics("*").Allow(user.Principal).Operations(kadm.OpRead, kadm.OpDescribe),
		kadm.NewACLs().TransactionalIDs("*").Allow(user.Principal).Operations(kadm.OpDescribe),
	} {
		results, err := k.Admin.CreateACLs(ctx, acl)
		for _, r := range results {
			err = errors.Join(err, r.Err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	topic := k.NewTopic(1)
	name := strings.TrimPrefix(user.Principal, "User:")
	config := func(ca string) string {
		p := filepath.Join(t.TempDir(), "client.properties")
		body := fmt.Sprintf(`bootstrap.servers=%s
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="%s" password="%s";
ssl.truststore.type=PEM
ssl.truststore.location=%s
`, strings.Join(k.Brokers, ","), name, user.Password, ca)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	code, out, stderr := eoskitCmdErr(t, "txn", "find-hanging", "-topic", topic, "-command-config", config(b.CAFile()))
	if code != exitOK || !strings.Contains(out, "no hanging transactions") {
		t.Fatalf("find-hanging over TLS: exit %d: %s%s", code, out, stderr)
	}
	start := time.Now()
	code, out, stderr = eoskitCmdErr(t, "txn", "find-hanging", "-topic", topic, "-command-config", config(foreignCA(t)))
	if took := time.Since(start); code != exitError || !strings.Contains(stderr, "certificate signed by unknown authority") || took > 20*time.Second {
		t.Fatalf("find-hanging trusting another CA: exit %d after %s: %s%s; want an error naming the certificate within seconds", code, took, out, stderr)
	}
	if strings.Contains(out+stderr, user.Password) {
		t.Fatal("the output carries the password")
	}

	// OAUTHBEARER, the token in a file a file: URL names, as Kafka's tools
	// read one: a token the broker's key signed is taken; an expired one is
	// refused within seconds, naming the cause, and quoted nowhere.
	sub := "oauth-operator"
	for _, acl := range []*kadm.ACLBuilder{
		kadm.NewACLs().Topics("*").Allow("User:"+sub).Operations(kadm.OpRead, kadm.OpDescribe),
		kadm.NewACLs().TransactionalIDs("*").Allow("User:" + sub).Operations(kadm.OpDescribe),
	} {
		results, err := k.Admin.CreateACLs(ctx, acl)
		for _, r := range results {
			err = errors.Join(err, r.Err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	oauthConfig := func(token string) string {
		dir := t.TempDir()
		tokenFile := filepath.Join(dir, "token")
		if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "client.properties")
		body := fmt.Sprintf(`bootstrap.servers=%s
security.protocol=SASL_SSL
sasl.mechanism=OAUTHBEARER
sasl.oauthbearer.token.endpoint.url=%s
ssl.truststore.type=PEM
ssl.truststore.location=%s
`, strings.Join(k.Brokers, ","), (&url.URL{Scheme: "file", Path: tokenFile}).String(), b.CAFile())
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	token := testbed.SignOAuth(t, b.OAuthKey(t), b.OAuthClaims(t, sub))
	code, out, stderr = eoskitCmdErr(t, "txn", "find-hanging", "-topic", topic, "-command-config", oauthConfig(token))
	if code != exitOK || !strings.Contains(out, "no hanging transactions") {
		t.Fatalf("find-hanging over OAUTHBEARER: exit %d: %s%s", code, out, stderr)
	}
	expired := b.OAuthClaims(t, sub)
	expired.Expiry = time.Now().Add(-time.Minute)
	token = testbed.SignOAuth(t, b.OAuthKey(t), expired)
	start = time.Now()
	code, out, stderr = eoskitCmdErr(t, "txn", "find-hanging", "-topic", topic, "-command-config", oauthConfig(token))
	if took := time.Since(start); code != exitError || !strings.Contains(stderr, "SASL_AUTHENTICATION_FAILED") || took > 20*time.Second {
		t.Fatalf("find-hanging with an expired token: exit %d after %s: %s%s; want an error naming the refusal within seconds", code, took, out, stderr)
	}
	if strings.Contains(out+stderr, token) {
		t.Fatal("the output carries the token")
	}
}

// foreignCA is the file of a CA that signed nothing the broker presents.
func foreignCA(t *testing.T) string {
	_, pemFile := testbed.ForeignCA(t)
	return pemFile
}

// The operator's command on a PostgreSQL that takes connections over TLS
// only, reached as libpq's environment names it (PGSSLMODE=verify-full,
// PGSSLROOTCERT, the password in a passfile): dead-letters list answers.
// Given a CA that did not sign the server's certificate it fails within
// seconds, naming the cause; the password is in no output.
func TestCommandOnADatabaseOverTLS(t *testing.T) {
	pg := testbed.StartPrivatePostgresWithTLS(t)
	pool, dbURL := pg.Database(t)
	if err := offsetstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	for _, v := range []string{"DATABASE_URL", "PGSERVICE", "PGSERVICEFILE", "PGSSLCERT", "PGSSLKEY", "PGOPTIONS", "PGTARGETSESSIONATTRS", "PGPASSWORD"} {
		t.Setenv(v, "")
	}
	t.Setenv("PGHOST", "localhost") // the certificate's name, checked
	t.Setenv("PGPORT", u.Port())
	t.Setenv("PGUSER", u.User.Username())
	t.Setenv("PGDATABASE", strings.TrimPrefix(u.Path, "/"))
	t.Setenv("PGSSLMODE", "verify-full")
	passfile := filepath.Join(t.TempDir(), "pgpass")
	if err := os.WriteFile(passfile, []byte("*:*:*:"+u.User.Username()+":"+password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PGPASSFILE", passfile)

	t.Setenv("PGSSLROOTCERT", pg.CAFile())
	code, out, stderr := eoskitCmdErr(t, "dead-letters", "list")
	if code != exitOK {
		t.Fatalf("dead-letters list over TLS: exit %d: %s%s", code, out, stderr)
	}

	_, foreign := testbed.ForeignCA(t)
	t.Setenv("PGSSLROOTCERT", foreign)
	start := time.Now()
	code, out, stderr = eoskitCmdErr(t, "dead-letters", "list")
	took := time.Since(start)
	if code == exitOK || !strings.Contains(out+stderr, "certificate signed by unknown authority") || took > 30*time.Second {
		t.Fatalf("with a CA that did not sign the server's certificate: exit %d after %s: %s%s; want an error naming the certificate within 30 s", code, took, out, stderr)
	}
	if strings.Contains(out+stderr, password) {
		t.Fatal("the output carries the database's password")
	}
}
