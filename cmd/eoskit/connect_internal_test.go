package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A Kafka client properties file, as Kafka's tools take it, gives the
// connection settings; what eoskit cannot honour is refused, not ignored.
func TestCommandConfigReadsKafkasProperties(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "client.properties")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	props, err := readProperties(write(`# a managed cluster
bootstrap.servers=b1:9093,b2:9093
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \
    username="alice" password="s3cret";
ssl.truststore.type=PEM
ssl.truststore.location: /etc/kafka/ca.pem
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := fromProperties(props)
	if err != nil {
		t.Fatal(err)
	}
	want := settings{brokers: "b1:9093,b2:9093", protocol: "SASL_SSL", mechanism: "scram-sha-512", user: "alice", pass: "s3cret", caFile: "/etc/kafka/ca.pem"}
	if s != want {
		t.Fatalf("read %+v, want %+v", s, want)
	}
	for body, refusal := range map[string]string{
		"security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\n":                       "GSSAPI",
		"security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\n":                  "OAUTHBEARER",
		"security.protocol=SSL\nssl.truststore.location=/ts.jks\n":                  "PEM truststores",
		"security.protocol=SSL\nssl.keystore.type=PKCS12\nssl.keystore.location=x": "PEM keystores",
		"security.protocol=SSL\nssl.endpoint.identification.algorithm=\n":          "host name",
		"security.protocol=KERBEROS\n":                                              "security.protocol",
	} {
		props, err := readProperties(write(body))
		if err == nil {
			_, err = fromProperties(props)
		}
		if err == nil || !strings.Contains(err.Error(), refusal) {
			t.Errorf("%q: %v, want a refusal naming %q", body, err, refusal)
		}
	}
	// PLAIN sends the password as it is: over TLS only.
	if _, err := (settings{brokers: "b:9092", mechanism: "plain", user: "u", pass: "p"}).connection(false); err == nil || !strings.Contains(err.Error(), "over TLS") {
		t.Errorf("PLAIN without TLS: %v, want a refusal", err)
	}
	if _, err := (settings{brokers: "b:9092", mechanism: "plain", user: "u", pass: "p"}).connection(true); err != nil {
		t.Errorf("PLAIN over TLS: %v", err)
	}
}
