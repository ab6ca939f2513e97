package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/testsupport/testbed"
)

// The operator's command over SASL_SSL, given a Kafka client properties
// file as Kafka's tools take it (SCRAM-SHA-512, a PEM truststore, the
// host name checked): find-hanging answers, as an application principal
// with Read and Describe. Given a CA that did not sign the broker's
// certificate it fails within seconds, naming the cause (before, it
// waited out -timeout); the password is in no output.
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
}

// foreignCA is the file of a CA that signed nothing the broker presents.
func foreignCA(t *testing.T) string {
	_, pemFile := testbed.ForeignCA(t)
	return pemFile
}
