package integration_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/verify"
)

// These examples are tests a user writes: each shows the body of a
// func TestX(t *testing.T), which go test runs against the services the
// kit finds (KAFKA_BROKERS and DATABASE_URL, else containers, else a skip).

// A test of code that writes to Kafka and reads back what it wrote: a
// broker (KAFKA_BROKERS, else a container), a topic of its own, a client.
func ExampleKafka() {
	testOrders := func(t *testing.T) {
		k := integration.Kafka(t)
		topic := k.NewTopic(3)                         // unique, ready on every broker, deleted at the end
		cl := k.Client(kgo.DefaultProduceTopic(topic)) // closed at the end
		if err := cl.ProduceSync(t.Context(), &kgo.Record{Value: []byte("order-1")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if recs := k.ReadAll(topic, kgo.ReadCommitted(), time.Minute); len(recs) != 1 {
			t.Fatalf("read %d records, want 1", len(recs))
		}
	}
	_ = testOrders
}

// Names that tests sharing a broker never share: a group, a transactional
// id, a topic created with settings of its own.
func ExampleUniqueName() {
	testCompacted := func(t *testing.T) {
		k := integration.Kafka(t)
		group := integration.UniqueName(t, "orders-loader") // orders-loader-TestCompacted-1f2e3d4c
		topic := integration.UniqueName(t, "customers")
		k.CreateTopic(topic, 6, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")})
		_ = group
	}
	_ = testCompacted
}

// Node faults on a three-node cluster of containers (Docker, on the host's
// network: EOSKIT_DOCKER_NETWORK=host): the code under test runs on
// c.Brokers while one node at a time stops, crashes, hangs or is replaced.
func ExampleStartCluster() {
	testThroughFaults := func(t *testing.T) {
		c := integration.StartCluster(t)
		ctx := t.Context()
		// ... start the code under test on c.Brokers ...
		steps := []func() error{
			func() error { return c.Nodes.Stop(ctx, 1, time.Minute) }, // SIGTERM; SIGKILL after a minute
			func() error { return c.Nodes.Start(ctx, 1) },             // back once every replica is in sync
			func() error { return c.Nodes.Kill(ctx, 2) },              // SIGKILL, as a crash
			func() error { return c.Nodes.Start(ctx, 2) },
			func() error { return c.Nodes.Pause(ctx, 3) }, // frozen, as a long GC pause
			func() error { return c.Nodes.Unpause(ctx, 3) },
			func() error { return c.Nodes.Replace(ctx, 1) }, // a new container on node 1's volume
		}
		for _, step := range steps {
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
	}
	_ = testThroughFaults
}

// A database of the test's own: created on the server DATABASE_URL names
// (else a container), dropped when the test ends.
func ExamplePostgres() {
	testSchema := func(t *testing.T) {
		pool := integration.Postgres(t)
		if _, err := pool.Exec(t.Context(), `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
	}
	_ = testSchema
}

// An eos.Processor copying one topic to another, checked by the verifier:
// no input lost or duplicated, none aborted made visible, each
// partition's order kept.
func ExampleKafkaCluster_VerifyTopic() {
	testCopy := func(t *testing.T) {
		k := integration.Kafka(t)
		in, out, group := k.NewTopic(3), k.NewTopic(3), integration.UniqueName(t, "copier")
		ids := k.Seed(in, 1000) // "in-0" .. "in-999", spread by key
		copyRecord := func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			return []*kgo.Record{{Topic: out, Key: r.Key, Value: verify.CopyValue(r)}}, nil
		}
		p, err := eos.NewProcessor(copyRecord, eos.Brokers(k.Brokers...), eos.Group(group),
			eos.Topics(in), eos.TransactionalID(group+"-0"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		k.WaitCaughtUp(group, in, time.Minute) // the group's offsets reach the input's end
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		t.Log(k.VerifyTopic(ids, out, time.Minute)) // fails t on any anomaly
	}
	_ = testCopy
}

// "Caught up" for an offsetstore.Runner, which keeps its offsets in
// PostgreSQL: MirrorToKafka copies them to the group after each database
// commit, where WaitCaughtUp reads them.
func ExampleKafkaCluster_WaitCaughtUp() {
	testLoader := func(t *testing.T) {
		k := integration.Kafka(t)
		pool := integration.Postgres(t)
		topic, group := k.NewTopic(3), integration.UniqueName(t, "loader")
		k.Seed(topic, 1000)
		if err := offsetstore.Migrate(t.Context(), pool); err != nil {
			t.Fatal(err)
		}
		load := func(context.Context, pgx.Tx, []*kgo.Record) error { return nil } // the handler under test
		r, err := offsetstore.NewRunner(pool, load, offsetstore.Brokers(k.Brokers...), offsetstore.Group(group),
			offsetstore.Topics(topic), offsetstore.MirrorToKafka())
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		k.WaitCaughtUp(group, topic, time.Minute) // fails t, naming each partition behind
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	_ = testLoader
}

// A program crashed with SIGKILL: the test binary runs it in a child
// process (RunChild in TestMain registers it), kills it mid-run and starts
// it again. TestFeedTotalsAreExactAfterASIGKILL is the whole test.
func ExampleStartChild() {
	// func TestMain(m *testing.M) {
	// 	integration.RunChild(map[string]integration.ChildFunc{"loader": runLoader})
	// 	os.Exit(m.Run())
	// }
	testCrash := func(t *testing.T) {
		k := integration.Kafka(t)
		topic, group := k.NewTopic(3), integration.UniqueName(t, "loader")
		args := []string{strings.Join(k.Brokers, ","), topic, group} // runLoader's args
		first := integration.StartChild(t, "loader", args...)
		// ... integration.WaitFor some progress ...
		if err := first.Kill(); err != nil { // SIGKILL; an error if it had exited already
			t.Fatal(err)
		}
		second := integration.StartChild(t, "loader", args...)
		k.WaitCaughtUp(group, topic, time.Minute)
		if err := second.Stop(30 * time.Second); err != nil { // SIGTERM: ctx ends in runLoader
			t.Fatal(err)
		}
	}
	_ = testCrash
}

// Totals a pipeline keeps in PostgreSQL, checked against what its input
// adds up to.
func ExampleVerifyTotals() {
	testTotals := func(t *testing.T) {
		pool := integration.Postgres(t)
		want := map[string]int64{"north": 2000, "south": 2000, "east": 2000}
		// ... run the pipeline on reports that add up to want ...
		integration.VerifyTotals(t, pool, `SELECT region, reports FROM totals`, want)
	}
	_ = testTotals
}

// A wait with a deadline, for a condition the kit has no helper for.
func ExampleWaitForCtx() {
	testProgress := func(t *testing.T) {
		pool := integration.Postgres(t)
		integration.WaitForCtx(t, time.Minute, "1000 rows", func(ctx context.Context) (bool, error) {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&n)
			return n >= 1000, err
		})
	}
	_ = testProgress
}

// A runner's log, written by its goroutines at once, read by the test.
func ExampleLogBuffer() {
	var buf integration.LogBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // for a stable example
			}
			return a
		},
	}))
	log.Warn("offsetstore: database transaction failed; retrying the batch", "attempt", 1)
	fmt.Print(buf.String())
	fmt.Println(strings.Contains(buf.String(), "retrying"))
	// Output:
	// level=WARN msg="offsetstore: database transaction failed; retrying the batch" attempt=1
	// true
}
