// Package leastprivilege_test runs each exactly-once path as an
// application principal on a broker that authenticates every client
// (SASL/SCRAM-SHA-512) and authorizes every request (StandardAuthorizer, no
// ACL no access), holding only the ACLs the README lists for that path.
package leastprivilege_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/testsupport/testbed"
	"github.com/eoskit/eoskit/verify"
)

// grant is one ACL of a path's list.
type grant struct {
	name string // as the error must name it: "Read on topic T"
	acl  *kadm.ACLBuilder
	// missing is what removing it must give: an error wrapping want from
	// Run, or, for the hanging check's own ACL, a warning naming it while
	// the copy still completes.
	want    error
	warning bool
	// named, if set, is what the error must name instead of name (a
	// refusal that reads "Describe (or Read or Write) on topics [T]").
	named string
}

// setup is one path's topics, group and principal.
type setup struct {
	path             string
	in, out, group   string
	txnID, principal string
	table            string
	// brokers are the runner's bootstrap addresses when not the
	// cluster's (another listener's).
	brokers []string
}

// grants is what the README lists for each path.
func (s setup) grants() []grant {
	topicRead := grant{name: "Read on topic " + s.in, acl: kadm.NewACLs().Topics(s.in).Allow(s.principal).Operations(kadm.OpRead), want: kerr.TopicAuthorizationFailed}
	groupRead := grant{name: "Read on group " + s.group, acl: kadm.NewACLs().Groups(s.group).Allow(s.principal).Operations(kadm.OpRead), want: kerr.GroupAuthorizationFailed}
	if s.path != "eos" {
		return []grant{topicRead, groupRead}
	}
	return []grant{topicRead, groupRead,
		{name: "Write on topic " + s.out, acl: kadm.NewACLs().Topics(s.out).Allow(s.principal).Operations(kadm.OpWrite), want: kerr.TopicAuthorizationFailed},
		{name: "Write on transactional id " + s.txnID, acl: kadm.NewACLs().TransactionalIDs(s.txnID).Allow(s.principal).Operations(kadm.OpWrite), want: kerr.TransactionalIDAuthorizationFailed},
		// The hanging-transaction check: DescribeProducers on the
		// outputs needs Read there.
		{name: "Read on topic " + s.out, acl: kadm.NewACLs().Topics(s.out).Allow(s.principal).Operations(kadm.OpRead), warning: true},
	}
}

func allow(ctx context.Context, t *testing.T, adm *kadm.Client, gs ...grant) {
	t.Helper()
	for _, g := range gs {
		results, err := adm.CreateACLs(ctx, g.acl)
		if err == nil {
			for _, r := range results {
				err = errors.Join(err, r.Err)
			}
		}
		if err != nil {
			t.Fatalf("grant %s: %v", g.name, err)
		}
	}
}

// Each path runs as an application principal with only the ACLs the README
// lists for it (no cluster right at all), from an input written by a
// transactional producer that also aborts, and copies every input exactly
// once. The eos processor's hanging-transaction check runs too: it logs
// that it looked at the output partitions (DescribeProducers answered, not
// refused). Then,
// for each ACL of the list, a fresh run without it: Run returns an error
// that wraps the broker's refusal and names the missing permission (the
// check's own ACL: a warning naming it, and the copy goes on), within 30
// s, never a stall; once the ACL is granted, the run copies every
// input exactly once: nothing was lost to the refusal. No log line and no
// error carries a password.
func TestEachPathRunsWithOnlyItsListedACLs(t *testing.T) {
	b := testbed.StartLocalBrokerWithACLs(t)
	k := b.KafkaCluster
	pool := integration.Postgres(t)
	// The paths side by side, each with a principal of its own: their
	// runs wait on refused reads (5 s each) far more than on the CPU.
	for _, path := range []string{"eos", "offsetstore", "dedup"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			k := k.For(t) // a parallel subtest fails itself, not the returned parent
			user := testbed.NewUser(t, k, "app-"+path)
			principal, opts, secret := user.Principal, user.Opts, user.Password
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			newSetup := func(name string) (setup, integration.Inputs) {
				return newPathSetup(ctx, t, k, pool, path, name, principal, 600)
			}
			verify := func(s setup, inputs integration.Inputs) {
				t.Helper()
				if path == "eos" {
					k.VerifyInputs(inputs, s.out, time.Minute)
					return
				}
				outs, err := verify.ReadRows(ctx, pool, s.table)
				if err != nil {
					t.Fatal(err)
				}
				if err := verify.Check(verify.Run{Input: inputs.Committed, Output: outs, AbortedInput: inputs.Aborted}).Err(); err != nil {
					t.Fatal(err)
				}
			}

			s, inputs := newSetup("all")
			allow(ctx, t, k.Admin, s.grants()...)
			logs := &integration.LogBuffer{}
			// eos: the hanging-transaction check must have looked at the
			// output (DescribeProducers answered), not merely not
			// turned itself off.
			looked := ""
			if path == "eos" {
				looked = "topics=[" + s.out // "eos: looked for hanging transactions"
			}
			if err := copyAll(ctx, t, k, pool, s, opts, logs, len(inputs.Committed), looked); err != nil {
				t.Fatalf("with every listed ACL, Run returned %v; logs:\n%s", err, logs)
			}
			verify(s, inputs)
			if strings.Contains(logs.String(), "hanging-transaction check is off") {
				t.Fatalf("with every listed ACL the hanging-transaction check was turned off:\n%s", logs)
			}
			noSecret(t, secret, logs.String())

			for i := range s.grants() {
				s, inputs := newSetup(fmt.Sprintf("without-%d", i))
				gs := s.grants()
				missing := gs[i]
				t.Run("without "+missing.name, func(t *testing.T) {
					allow(ctx, t, k.Admin, append(append([]grant{}, gs[:i]...), gs[i+1:]...)...)
					logs := &integration.LogBuffer{}
					waitLog := ""
					if missing.warning {
						waitLog = missing.name
					}
					start := time.Now()
					err := copyAll(ctx, t, k, pool, s, opts, logs, len(inputs.Committed), waitLog)
					if took := time.Since(start); err != nil && took > 30*time.Second {
						t.Fatalf("without %s, Run took %s to return %v; want it within 30 s", missing.name, took, err)
					}
					switch {
					case missing.warning:
						if err != nil {
							t.Fatalf("without %s, Run returned %v; want the copy to complete with a warning", missing.name, err)
						}
						if !strings.Contains(logs.String(), missing.name) {
							t.Fatalf("without %s, no warning named it; logs:\n%s", missing.name, logs)
						}
					case err == nil:
						t.Fatalf("without %s, Run copied everything", missing.name)
					case !errors.Is(err, missing.want) || !strings.Contains(err.Error(), missing.name):
						t.Fatalf("without %s, Run returned %v; want an error wrapping %v that names the permission", missing.name, err, missing.want)
					default:
						t.Logf("without %s: %v", missing.name, err)
						noSecret(t, secret, err.Error())
						allow(ctx, t, k.Admin, missing)
						if err := copyAll(ctx, t, k, pool, s, opts, logs, len(inputs.Committed), ""); err != nil {
							t.Fatalf("once %s was granted, Run returned %v", missing.name, err)
						}
					}
					verify(s, inputs)
					noSecret(t, secret, logs.String())
				})
			}
		})
	}
	t.Run("eos with keyed state", func(t *testing.T) { t.Parallel(); statefulProcessorUnderACLs(t, b) })
	t.Run("eos joining a table", func(t *testing.T) { t.Parallel(); tableJoinUnderACLs(t, b) })
	t.Run("eos grouped by a derived key", func(t *testing.T) { t.Parallel(); groupedUnderACLs(t, b) })
}

// copyAll runs s's path as the principal of opts until it has handled n
// inputs (nil), or Run returns (its error). A run that does neither within
// 90 s is a stall, and fails t naming it.
func copyAll(ctx context.Context, t *testing.T, k *integration.KafkaCluster, pool *pgxpool.Pool, s setup, opts []kgo.Opt, logs *integration.LogBuffer, n int, waitLog string) error {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	clientOpts := append(slices.Clip(opts), kgo.SessionTimeout(6*time.Second), kgo.WithLogger(kslog.New(logger)))
	brokers := k.Brokers
	if s.brokers != nil {
		brokers = s.brokers
	}
	// done reads how many distinct inputs the output holds, committed.
	done := func() bool {
		if s.path == "eos" {
			ids := map[string]bool{}
			for _, r := range k.ReadNow(s.out, kgo.ReadCommitted(), 30*time.Second) {
				ids[string(r.Key)] = true
			}
			return len(ids) >= n
		}
		var c int
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT id) FROM `+pgx.Identifier{s.table}.Sanitize()).Scan(&c); err != nil {
			t.Fatalf("count rows: %v", err)
		}
		return c >= n
	}
	var run func(context.Context) error
	switch s.path {
	case "eos":
		p, err := eos.NewProcessor(func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			return []*kgo.Record{{Topic: s.out, Key: r.Key, Value: verify.CopyValue(r)}}, nil
		}, eos.Brokers(brokers...), eos.Group(s.group), eos.Topics(s.in), eos.TransactionalID(s.txnID),
			eos.Logger(logger), eos.ClientOptions(clientOpts...), eos.HangingTransactionCheck(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		run = p.Run
	case "offsetstore":
		insert := `INSERT INTO ` + pgx.Identifier{s.table}.Sanitize() + ` (id, part, off) VALUES ($1, $2, $3)`
		r, err := offsetstore.NewRunner(pool, func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
			for _, rec := range recs {
				if _, err := tx.Exec(ctx, insert, string(rec.Key), rec.Partition, rec.Offset); err != nil {
					return err
				}
			}
			return nil
		}, offsetstore.Brokers(brokers...), offsetstore.Group(s.group), offsetstore.Topics(s.in),
			offsetstore.Logger(logger), offsetstore.ClientOptions(clientOpts...))
		if err != nil {
			t.Fatal(err)
		}
		run = r.Run
	case "dedup":
		insert := `INSERT INTO ` + pgx.Identifier{s.table}.Sanitize() + ` (id, part, off) VALUES ($1, $2, $3)`
		store, err := dedup.NewPostgresStore(s.table + "_ids")
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		c, err := dedup.NewConsumer(pool, store, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
			_, err := tx.Exec(ctx, insert, string(rec.Key), rec.Partition, rec.Offset)
			return err
		}, dedup.Brokers(brokers...), dedup.Group(s.group), dedup.Topics(s.in), dedup.ID(dedup.KeyID()),
			dedup.Logger(logger), dedup.ClientOptions(append(clientOpts, kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...))
		if err != nil {
			t.Fatal(err)
		}
		run = c.Run
	}
	// A warning awaited comes from the hanging-transaction check, which
	// looks at the outputs once written to.
	return runUntil(ctx, t, run, func() bool { return done() && strings.Contains(logs.String(), waitLog) }, func() string {
		return fmt.Sprintf("%s neither returned nor handled all %d inputs; logs:\n%s", s.path, n, logs)
	})
}

// newPathSetup makes a path's topics, group (and transactional id, or
// results table) for a run named name as principal, and seeds its input
// with n committed records from a transactional producer that also
// aborts.
func newPathSetup(ctx context.Context, t *testing.T, k *integration.KafkaCluster, pool *pgxpool.Pool, path, name, principal string, n int) (setup, integration.Inputs) {
	t.Helper()
	s := setup{path: path, in: k.NewTopic(2), group: integration.UniqueName(t, "g-"+name), principal: principal}
	if path == "eos" {
		s.out = k.NewTopic(2)
		var err error
		if s.txnID, err = eos.StableTransactionalID(s.group, "0"); err != nil {
			t.Fatal(err)
		}
	} else {
		s.table = newResultsTable(ctx, t, pool, path, name)
	}
	return s, k.SeedHostile(s.in, n, 100)
}

// newResultsTable creates a results table laid out as verify.ReadRows
// reads it, with no unique constraint: a duplicate is a second row.
func newResultsTable(ctx context.Context, t *testing.T, pool *pgxpool.Pool, path, name string) string {
	t.Helper()
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	table := fmt.Sprintf("lp_%s_%s_%x", path, strings.ReplaceAll(name, "-", "_"), suffix)
	if _, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{table}.Sanitize()+` (seq bigserial PRIMARY KEY, id text NOT NULL, part integer NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if path == "offsetstore" {
		if err := offsetstore.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	return table
}

// noSecret fails t if text holds the password.
func noSecret(t *testing.T, secret, text string) {
	t.Helper()
	if secret == "" { // a certificate's principal: no password
		return
	}
	if strings.Contains(text, secret) {
		t.Fatal("a log line or an error carries the principal's password")
	}
}
