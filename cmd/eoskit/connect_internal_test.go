package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// connectWith resolves the connection a command would make from a
// -command-config file holding body and the flags args.
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
	props, err := readProperties(p)
	if err != nil {
		return settings{}, connection{}, err
	}
	s, err := fromProperties(props)
	if err != nil {
		return s, connection{}, err
	}
	c, err := kf.connect()
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
	// -sasl-token-file, which lifts the refusal of an identity provider.
	if s, _, err := connectWith(t, "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=file:///run/token\n"); err != nil || s.tokenFile != "/run/token" {
		t.Errorf("OAUTHBEARER with a file: URL: token file %q, %v", s.tokenFile, err)
	}
	if _, _, err := connectWith(t, "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.token.endpoint.url=https://idp/token\n", "-sasl-token-file", "/run/token"); err != nil {
		t.Errorf("OAUTHBEARER from an identity provider overridden by -sasl-token-file: %v", err)
	}
	// PLAIN over TLS is taken.
	if _, _, err := connectWith(t, "security.protocol=SASL_SSL\nsasl.mechanisms=PLAIN\nsasl.username=u\nsasl.password=p\n"); err != nil {
		t.Errorf("PLAIN over TLS (librdkafka's sasl.mechanisms): %v", err)
	}
}
