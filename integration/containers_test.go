package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// containersSuite skips t outside the containers suite (scripts/containers.sh,
// which make test runs): these tests start containers whatever the
// environment names, and the main suite needs no Docker engine (make
// test starts one meanwhile, for this suite).
func containersSuite(t *testing.T) {
	t.Helper()
	if os.Getenv("EOSKIT_CONTAINERS") != "1" {
		t.Skip("runs in the containers suite (scripts/containers.sh, part of make test)")
	}
}

func TestDocsShowTheExampleTest(t *testing.T) {
	doc, err := os.ReadFile("../docs/testing-your-application.md")
	if err != nil {
		t.Fatal(err)
	}
	test, err := os.ReadFile("docsexample_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fn := func(b []byte) string {
		s := string(b)
		i := strings.Index(s, "func TestOrdersAreReadBack(")
		if i < 0 {
			return ""
		}
		j := strings.Index(s[i:], "\n}\n")
		if j < 0 {
			return ""
		}
		return s[i : i+j+2]
	}
	want := fn(test)
	if want == "" {
		t.Fatal("docsexample_test.go has no TestOrdersAreReadBack")
	}
	if got := fn(doc); got != want {
		t.Errorf("docs/testing-your-application.md's example test differs from docsexample_test.go's:\ndocs:\n%s\ndocsexample_test.go:\n%s", got, want)
	}
}

func TestRunKafkaRefusesAClusterWithoutTheHostNetwork(t *testing.T) {
	_, err := integration.RunKafka(context.Background(), integration.WithNodes(3), integration.WithHostNetwork(false))
	if err == nil || !strings.Contains(err.Error(), "needs the host network") {
		t.Fatalf("RunKafka(WithNodes(3), no host network) = %v, want a refusal naming the host network", err)
	}
	if errors.Is(err, integration.ErrNoDocker) {
		t.Fatalf("a refused configuration is not a missing Docker: %v", err)
	}
}

// TestContainerKafkaKeepsItsDataOnItsVolume stops a one-node container
// (SIGTERM) and starts it, kills it (SIGKILL) and starts it, replaces it
// with a new container on the same volume, and pauses it (a paused node
// answers nothing) and unpauses it, and reads back after each what was
// written before: the data is on the node's volume (the new container has
// nothing else), and the address has not moved.
func TestContainerKafkaKeepsItsDataOnItsVolume(t *testing.T) {
	containersSuite(t)
	k := integration.StartKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	const topic, n = "kept", 1000
	if resp, err := kadm.NewClient(cl).CreateTopic(ctx, 2, 1, nil, topic); err != nil || resp.Err != nil {
		t.Fatal(err, resp.Err)
	}
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: topic, Value: fmt.Appendf(nil, "%d", i)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := k.Stop(ctx, 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := k.Start(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := count(ctx, t, k.Brokers(), topic, n); got != n {
		t.Fatalf("read %d records after the restart, want %d", got, n)
	}
	if err := k.Kill(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := k.Start(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := count(ctx, t, k.Brokers(), topic, n); got != n {
		t.Fatalf("read %d records after a kill and a start, want %d", got, n)
	}
	if err := k.Replace(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := count(ctx, t, k.Brokers(), topic, n); got != n {
		t.Fatalf("read %d records from the replaced container, want %d", got, n)
	}
	if err := k.Pause(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// A client of its own: one that asked before may answer Metadata
	// from its cache.
	fresh, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	pausedCtx, cancelPaused := context.WithTimeout(ctx, 2*time.Second)
	_, err = kadm.NewClient(fresh).BrokerMetadata(pausedCtx)
	cancelPaused()
	fresh.Close()
	if err == nil {
		t.Fatal("a paused node answered Metadata")
	}
	if err := k.Unpause(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := count(ctx, t, k.Brokers(), topic, n); got != n {
		t.Fatalf("read %d records after a pause, want %d", got, n)
	}
}

func count(ctx context.Context, t *testing.T, brokers []string, topic string, want int) int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := 0
	for got < want {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records of %s before the deadline", got, want, topic)
		}
		fetches.EachError(func(topic string, p int32, err error) { t.Logf("fetch %s[%d]: %v", topic, p, err) })
		got += len(fetches.Records())
	}
	return got
}

// TestContainerClusterOfThreeCommitsThroughAStoppedNode runs three nodes,
// stops the one leading the topic's partition and commits a transaction
// while it is down: the cluster has replication factor 3 and
// min.insync.replicas 2, as WithNodes promises.
func TestContainerClusterOfThreeCommitsThroughAStoppedNode(t *testing.T) {
	containersSuite(t)
	k := integration.StartKafka(t, integration.WithNodes(3), integration.WithHostNetwork(true))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.TransactionalID("integration-cluster"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	const topic = "replicated"
	if resp, err := adm.CreateTopic(ctx, 1, -1, nil, topic); err != nil || resp.Err != nil {
		t.Fatal(err, resp.Err)
	}
	// A new topic reaches every node's metadata a moment later.
	var p kadm.PartitionDetail
	for len(p.Replicas) < 3 || p.Leader < 0 {
		md, err := adm.Metadata(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		if p = md.Topics[topic].Partitions[0]; ctx.Err() != nil {
			t.Fatalf("%s has %d replicas (leader %d) at the deadline, want 3", topic, len(p.Replicas), p.Leader)
		}
		time.Sleep(100 * time.Millisecond)
	}
	leader := int(p.Leader)
	if err := k.Stop(ctx, leader, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("while a node is down")}).FirstErr(); err == nil {
		t.Log("produced with node", leader, "stopped")
	} else {
		t.Fatalf("produce with node %d stopped: %v", leader, err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit with node %d stopped: %v", leader, err)
	}
	if err := k.Start(ctx, leader); err != nil {
		t.Fatal(err)
	}
	if got := count(ctx, t, k.Brokers(), topic, 1); got != 1 {
		t.Fatalf("read %d committed records, want 1", got)
	}
}

func TestContainerPostgresLetsItsRoleCreateDatabases(t *testing.T) {
	containersSuite(t)
	url := integration.StartPostgres(t).URL()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var version string
	if _, err := conn.Exec(ctx, "CREATE DATABASE made_by_the_test"); err != nil {
		t.Fatalf("the container's role may not create databases: %v", err)
	}
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL %s at %s", version, url)
}

// TestContainerRyukIsTurnedOffWhereItsImageCannotBeHad runs the docs' example
// test in a child process with TESTCONTAINERS_RYUK_DISABLED unset and no
// broker in the environment, on an engine that has not got testcontainers'
// reaper image and (with no registry) can not pull it: the kit must turn
// the reaper off rather than fail on it, and still get a broker.
func TestContainerRyukIsTurnedOffWhereItsImageCannotBeHad(t *testing.T) {
	containersSuite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestOrdersAreReadBack$", "-test.v")
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "TESTCONTAINERS_RYUK_DISABLED", integration.KafkaBrokersEnv:
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestOrdersAreReadBack") {
		t.Fatalf("the example test without TESTCONTAINERS_RYUK_DISABLED: %v\n%s", err, out)
	}
	// Either the kit turned the reaper off, or the engine has its image
	// (pulled by the child: an engine that reaches a registry).
	if !strings.Contains(string(out), "reaper off (TESTCONTAINERS_RYUK_DISABLED=true)") &&
		exec.CommandContext(ctx, "docker", "image", "inspect", testcontainers.ReaperDefaultImage).Run() != nil {
		t.Errorf("the reaper's image is not on the engine, and the child did not say it turned the reaper off:\n%s", out)
	}
}

// The kit's PostgreSQL runs the outbox: wal_level=logical, so Migrate
// creates its table, publication and slot. Before, Migrate failed with
// outbox.ErrWALLevel exactly when Docker was present (issue 47 item 3,
// failing on 3bfa998).
func TestContainerPostgresRunsTheOutbox(t *testing.T) {
	containersSuite(t)
	url := integration.StartPostgres(t).URL()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var level string
	if err := pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil || level != "logical" {
		t.Fatalf("wal_level = %q (%v), want logical", level, err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatalf("outbox.Migrate on the kit's PostgreSQL: %v", err)
	}
	slot, err := outbox.DefaultSlot(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.DropSlot(ctx, pool, slot); err != nil {
		t.Fatal(err)
	}
}
