package testbed_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

func TestLocalBrokerSurvivesHardRestart(t *testing.T) {
	t.Parallel()
	b := testbed.StartLocalBroker(t)
	topic := b.NewTopic(2)
	cl := b.Client(kgo.TransactionalID(integration.UniqueName(t, "tx")), kgo.DefaultProduceTopic(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	commit := func(prefix string, n int) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: fmt.Appendf(nil, "%s%d", prefix, i)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatalf("commit %s: %v", prefix, err)
		}
	}
	commit("before", 50)
	if err := b.Restart(ctx, true); err != nil {
		t.Fatalf("restart: %v (broker log: %s)", err, b.Log())
	}
	commit("after", 50)

	got := map[string]int{} // times each value was read
	for _, r := range b.ReadAll(topic, kgo.ReadCommitted(), 30*time.Second) {
		got[string(r.Value)]++
	}
	if len(got) != 100 || got["before0"] != 1 || got["after49"] != 1 {
		t.Fatalf("after a SIGKILL restart read %d distinct values, want the 100 committed on either side", len(got))
	}
}

// The three-node cluster with ACLs authenticates every client and
// authorizes every request, through the proxies too: a user with no ACL is
// refused the topic; granted Read, it reads what the super user wrote,
// directly and through the proxies; a client with a wrong password is not
// let in at all.
func TestLocalClusterWithACLsAuthenticatesAndAuthorizes(t *testing.T) {
	t.Parallel()
	c := testbed.StartLocalClusterWithACLs(t)
	k := c.KafkaCluster
	topic := k.NewTopic(3)
	ids := k.Seed(topic, 30)
	user := testbed.NewUser(t, k, "reader")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	read := func(opts []kgo.Opt) (int, error) {
		cl, err := kgo.NewClient(append(opts, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
		if err != nil {
			return 0, err
		}
		defer cl.Close()
		pollCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n := 0
		for n < len(ids) {
			f := cl.PollFetches(pollCtx)
			if err := pollCtx.Err(); err != nil {
				return n, err
			}
			var fetchErr error
			f.EachError(func(_ string, _ int32, err error) { fetchErr = err })
			if fetchErr != nil {
				return n, fetchErr
			}
			n += f.NumRecords()
		}
		return n, nil
	}
	if _, err := read(user.Opts); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("a user with no ACL read the topic (err %v); want TOPIC_AUTHORIZATION_FAILED", err)
	}
	results, err := k.Admin.CreateACLs(ctx, kadm.NewACLs().Topics(topic).Allow(user.Principal).Operations(kadm.OpRead))
	if err == nil {
		for _, r := range results {
			err = errors.Join(err, r.Err)
		}
	}
	if err != nil {
		t.Fatalf("grant Read: %v", err)
	}
	proxied := append([]kgo.Opt{kgo.SeedBrokers(c.Proxied(t).Brokers...)}, user.Opts[1:]...)
	for name, opts := range map[string][]kgo.Opt{"direct": user.Opts, "through the proxies": proxied} {
		// The ACL reaches each node through the metadata log: retry a
		// refusal until the deadline.
		for {
			n, err := read(opts)
			if err == nil && n == len(ids) {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: read %d of %d records once granted Read: %v", name, n, len(ids), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	wrong, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.SASL(scram.Auth{User: "reader", Pass: "wrong"}.AsSha512Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, wrong); !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("a wrong password gave %v; want SASL_AUTHENTICATION_FAILED", err)
	}
}

// A private PostgreSQL asks for its role's password on every connection,
// replication included: the server is reachable by every local user, so
// trust authentication would hand each of them a superuser (issue 47 item
// 17; on 7d16fbd initdb ran with --auth=trust and this test failed).
func TestPrivatePostgresAsksForItsPassword(t *testing.T) {
	pg := testbed.StartPrivatePostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := u.User.Password(); !ok {
		t.Fatalf("the private server's URL carries no password: %s", u.Redacted())
	}
	conn, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatalf("with its password: %v", err)
	}
	_ = conn.Close(ctx)
	for _, tc := range []struct{ name, query string }{{"a session", ""}, {"a replication connection", "replication=database"}} {
		wrong := *u
		wrong.User = url.UserPassword(u.User.Username(), "wrong")
		without := *u
		without.User = url.User(u.User.Username())
		for _, v := range []url.URL{wrong, without} {
			q := v.Query()
			if tc.query != "" {
				q.Set("replication", "database")
			}
			v.RawQuery = q.Encode()
			c, err := pgconn.Connect(ctx, v.String())
			if err == nil {
				_ = c.Close(ctx)
				t.Errorf("%s as %s was let in without the right password", tc.name, v.Redacted())
				continue
			}
			if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
				t.Errorf("%s as %s: %v, want the server's refusal of the password (28P01)", tc.name, v.Redacted(), err)
			}
		}
	}
}
