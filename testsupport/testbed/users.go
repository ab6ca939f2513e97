package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/eoskit/eoskit/integration"
)

// User is an application principal on a broker or cluster with ACLs.
type User struct {
	Principal string    // User:name, as ACLs name it
	Password  string    // to check that no log or error carries it
	Opts      []kgo.Opt // the seed brokers and the SASL mechanism that connect as it
}

// NewUser creates the SCRAM-SHA-512 user name, with no ACL, on a broker
// or cluster started with ACLs ([StartLocalBrokerWithACLs],
// [StartLocalClusterWithACLs], [StartLocalBrokerWithTLS]); conn are more
// options to connect with (a TLS configuration), which its Opts carry.
func NewUser(tb testing.TB, k *integration.KafkaCluster, name string, conn ...kgo.Opt) User {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var secret [16]byte
	_, _ = rand.Read(secret[:])
	pass := hex.EncodeToString(secret[:])
	altered, err := k.Admin.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: name, Mechanism: kadm.ScramSha512, Iterations: 4096, Password: pass}})
	if err == nil {
		altered.EachError(func(a kadm.AlteredUserSCRAM) { err = fmt.Errorf("%w: %s", a.Err, a.ErrMessage) })
	}
	if err != nil {
		tb.Fatalf("testbed: create user %s: %v", name, err)
	}
	// A new credential reaches the broker through its metadata log:
	// wait until it lets the user in.
	opts := append([]kgo.Opt{scramOpt(name, pass)}, conn...)
	integration.KafkaAt(tb, k.Brokers, opts...)
	return User{Principal: "User:" + name, Password: pass, Opts: append([]kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, opts...)}
}

func scramOpt(user, pass string) kgo.Opt {
	return kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism())
}
