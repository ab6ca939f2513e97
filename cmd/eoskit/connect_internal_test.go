package main

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// connectWith resolves the settings (the file's and the flags' merged)
// and the connection a command would make from a -command-config file
// holding body and the flags args.
func connectWith(t *testing.T, body string, args ...string) (settings, connection, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "client.properties")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	kf := addKafkaFlags(fs)
	if err := fs.Parse(append([]string{"-command-config", p}, args...)); err != nil {
		t.Fatal(err)
	}
	s, useTLS, err := kf.settings()
	if err != nil {
		return s, connection{}, err
	}
	c, err := s.connection(useTLS)
	return s, c, err
}

// A Kafka client properties file, as Kafka's tools take it (Java's
// properties syntax), gives the connection settings; what eoskit cannot
// honour is refused, not ignored, unless a flag gives that setting; an
// error never quotes a line (it may hold a password).
func TestCommandConfigReadsKafkasProperties(t *testing.T) {
	t.Setenv("EOSKIT_SASL_PASSWORD", "")
	ca := foreignCA(t)
	s, c, err := connectWith(t, `# a managed cluster
bootstrap.servers = b1\:9093, b2:9093
security.protocol SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    username='alice' password="s3\\"cret";
ssl.truststore.type=PEM
ssl.truststore.location: `+ca+`
`)
	if err != nil {
		t.Fatal(err)
	}
	if s.brokers != "b1:9093, b2:9093" || s.protocol != "SASL_SSL" || s.mechanism != "scram-sha-512" || s.user != "alice" || s.pass != `s3"cret` || s.caFile != ca {
		t.Fatalf("read %+v", s)
	}
	if strings.Join(c.seeds, ",") != "b1:9093,b2:9093" {
		t.Fatalf("seeds %q", c.seeds)
	}
	for body, refusal := range map[string]string{
		"security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\n":                                                             "GSSAPI",
		"security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n":                                                        "sasl.oauthbearer.token.endpoint.url",
		"security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=https://idp/token\n": "from a file",
		"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=file:///t\n":   "over TLS",
		"security.protocol=SSL\nssl.truststore.location=/ts.jks\n":                                                        "PEM truststores",
		"security.protocol=SSL\nssl.keystore.type=PKCS12\nssl.keystore.location=x":                                        "PEM keystores",
		"security.protocol=SSL\nssl.endpoint.identification.algorithm=\n":                                                 "host-name check off",
		"security.protocol=SSL\nssl.endpoint.identification.algorithm=none\n":                                             "host-name check off",
		"security.protocol=KERBEROS\n":                                                                                    "security.protocol",
		"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\n":                      "over TLS",
		"sasl.password=hunter2 \\\n":                                                                                      "continued line",
	} {
		_, _, err := connectWith(t, body)
		if err == nil || !strings.Contains(err.Error(), refusal) {
			t.Errorf("%q: %v, want a refusal naming %q", body, err, refusal)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%q: the error quotes the password: %v", body, err)
		}
	}
	// A flag given for a setting lifts the file's refusal of it.
	if _, _, err := connectWith(t, "security.protocol=SSL\nssl.truststore.location=/ts.jks\n", "-tls-ca", ca); err != nil {
		t.Errorf("a JKS truststore overridden by -tls-ca: %v", err)
	}
	// OAUTHBEARER reads the token from the file of a file: URL, or of
	// -sasl-token-file, which lifts the refusal of an identity provider;
	// another mechanism given lifts it too.
	if s, _, err := connectWith(t, "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=file:///run/token\n"); err != nil || s.tokenFile != "/run/token" {
		t.Errorf("OAUTHBEARER with a file: URL: token file %q, %v", s.tokenFile, err)
	}
	if _, _, err := connectWith(t, "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=https://idp/token\n", "-sasl-token-file", "/run/token"); err != nil {
		t.Errorf("OAUTHBEARER from an identity provider overridden by -sasl-token-file: %v", err)
	}
	idp := "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=https://id:s3cret@idp/token\n"
	t.Setenv("EOSKIT_SASL_PASSWORD", "p")
	if s, _, err := connectWith(t, idp, "-sasl-mechanism", "scram-sha-512", "-sasl-user", "u"); err != nil || s.mechanism != "scram-sha-512" || s.tokenFile != "" {
		t.Errorf("an OAUTHBEARER file overridden by -sasl-mechanism scram-sha-512: %+v, %v", s, err)
	}
	t.Setenv("EOSKIT_SASL_PASSWORD", "")
	if _, _, err := connectWith(t, idp); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("an identity provider's URL: %v; want a refusal that does not quote it", err)
	}
	scramFile := "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=u\nsasl.password=p\n"
	if s, _, err := connectWith(t, scramFile, "-sasl-token-file", "/run/token"); err != nil || s.mechanism != "oauthbearer" || s.user != "" {
		t.Errorf("a SCRAM file with -sasl-token-file: %+v, %v; want OAUTHBEARER, the flag winning", s, err)
	}
	for _, args := range [][]string{
		{"-sasl-mechanism", "scram-sha-512", "-sasl-user", "u", "-sasl-token-file", "/run/token"},
		{"-sasl-user", "u", "-sasl-token-file", "/run/token"},
	} {
		if _, _, err := connectWith(t, "security.protocol=SASL_SSL\n", args...); err == nil {
			t.Errorf("%q: taken; want a refusal (a token file and a user name do not go together)", args)
		}
	}
	ext := "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=file:///run/token\n" +
		`sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required extension_logicalCluster="lkc-1" extension_identityPoolId='pool-2';` + "\n"
	if s, _, err := connectWith(t, ext); err != nil || s.extensions["logicalCluster"] != "lkc-1" || s.extensions["identityPoolId"] != "pool-2" {
		t.Errorf("OAUTHBEARER's JAAS extensions: %v, %v", s.extensions, err)
	}
	// PLAIN over TLS is taken.
	if _, _, err := connectWith(t, "security.protocol=SASL_SSL\nsasl.mechanisms=PLAIN\nsasl.username=u\nsasl.password=p\n"); err != nil {
		t.Errorf("PLAIN over TLS (librdkafka's sasl.mechanisms): %v", err)
	}
}

// A token endpoint's file: URL is read as Kafka reads it; anything else
// is refused without quoting the URL.
func TestTokenFileOfAFileURL(t *testing.T) {
	for endpoint, want := range map[string]string{
		"file:///run/token":          filepath.FromSlash("/run/token"),
		"file://localhost/run/token": filepath.FromSlash("/run/token"),
		"file:///C:/token":           filepath.FromSlash("C:/token"),
	} {
		if got, err := tokenFile(endpoint); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", endpoint, got, err, want)
		}
	}
	for _, endpoint := range []string{"", "file://run/token", "file:token", "file:///", "file:///run/my%20token", "https://idp/token?client_secret=s3cret", "::"} {
		got, err := tokenFile(endpoint)
		if err == nil {
			t.Errorf("%q: taken as %q", endpoint, got)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: the error quotes the secret: %v", endpoint, err)
		}
	}
}

// The OAUTHBEARER token is read at each authentication: a token renewed
// in its file is the next connection's.
func TestOAuthTokenFileIsReadAtEachAuthentication(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	mech := oauthFromFile(file, map[string]string{"logicalCluster": "lkc-1"})
	if _, _, err := mech.Authenticate(context.Background(), "b:9093"); err == nil {
		t.Fatal("no token file: authenticated")
	}
	for _, token := range []string{"first.jwt.token", "second.jwt.token"} {
		if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, msg, err := mech.Authenticate(context.Background(), "b:9093")
		if err != nil || !strings.Contains(string(msg), "auth=Bearer "+token+"\x01") || !strings.Contains(string(msg), "logicalCluster=lkc-1") {
			t.Fatalf("after writing %s: sent %q, %v", token, msg, err)
		}
	}
	if err := os.WriteFile(file, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := mech.Authenticate(context.Background(), "b:9093"); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("an empty token file: %v", err)
	}
}
