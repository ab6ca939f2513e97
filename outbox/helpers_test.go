package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/testsupport/testbed"
	"github.com/eoskit/eoskit/verify"
)

// TestMain doubles as the entry point of the relay processes that the
// crash tests SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv("EOS_TEST_RELAY") == "1" {
		os.Exit(relayMain())
	}
	os.Exit(m.Run())
}

// bed is one test's outbox: a database migrated for it, its slot, an
// output topic of 6 partitions and a position topic.
type bed struct {
	k         *integration.KafkaCluster
	pool      *pgxpool.Pool
	url       string
	slot      string
	out       string
	positions string
	load      *testbed.OutboxLoad
}

func newBed(t *testing.T, k *integration.KafkaCluster) *bed {
	t.Helper()
	pool, url := integration.PostgresWithURL(t)
	return newBedOn(t, k, pool, url)
}

// newBedOn readies the outbox on pool (whose URL the relay processes
// use), with the key sequences the writers keep.
func newBedOn(t *testing.T, k *integration.KafkaCluster, pool *pgxpool.Pool, url string) *bed {
	t.Helper()
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	slot, err := outbox.DefaultSlot(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	// Runs after every relay of the test was stopped (cleanups run last
	// registered first): a slot blocks DROP DATABASE and keeps WAL.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		for range 50 {
			if err := outbox.DropSlot(ctx, pool, slot); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("drop slot %s failed", slot)
	})
	b := &bed{k: k, pool: pool, url: url, slot: slot, out: k.NewTopic(6), positions: k.NewTopic(1)}
	if b.load, err = testbed.NewOutboxLoad(ctx, pool, b.out); err != nil {
		t.Fatal(err)
	}
	return b
}

// poolWithWalSenderTimeout opens a pool on url (as cfg, when given, sets
// it up) whose connections, the relay's replication ones included (they
// take the pool's settings), ask for a wal_sender_timeout of d: PostgreSQL
// ends a replication session that answers nothing for d (60 s by default),
// so a stalled relay's slot is free after d rather than a minute.
func poolWithWalSenderTimeout(t *testing.T, url string, d time.Duration, cfg func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	c, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		cfg(c)
	}
	c.ConnConfig.RuntimeParams["wal_sender_timeout"] = fmt.Sprintf("%dms", d.Milliseconds())
	pool, err := pgxpool.NewWithConfig(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var got string
	if err := pool.QueryRow(context.Background(), `SELECT setting FROM pg_settings WHERE name = 'wal_sender_timeout'`).Scan(&got); err != nil || got != strconv.FormatInt(d.Milliseconds(), 10) {
		t.Fatalf("wal_sender_timeout on the pool's connections is %q ms (%v); want %d", got, err, d.Milliseconds())
	}
	return pool
}

// startOn runs a relay on pool (not the bed's) with the bed's options.
func (b *bed) startOn(t *testing.T, pool *pgxpool.Pool, extra ...outbox.Option) *running {
	t.Helper()
	r, err := outbox.NewRelay(pool, b.opts(t, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return startRelay(t, r)
}

func (b *bed) opts(t testing.TB, extra ...outbox.Option) []outbox.Option {
	return append([]outbox.Option{
		outbox.Brokers(b.k.Brokers...), outbox.PositionTopic(b.positions),
		outbox.Logger(testLogger(t)),
	}, extra...)
}

// testLogger shows the relay's warnings (restarts and their causes) on
// stderr, named by test; EOS_TEST_LOG=1 shows its Info lines too.
func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("EOS_TEST_LOG") != "" {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("test", t.Name())
}

// relay runs a relay in the test until stop is called, which returns
// Run's error.
type running struct {
	relay  *outbox.Relay
	cancel context.CancelFunc
	done   chan error
}

func (b *bed) start(t *testing.T, extra ...outbox.Option) *running {
	t.Helper()
	return b.startOn(t, b.pool, extra...)
}

// startRelay runs r until the test ends (or stop).
func startRelay(t *testing.T, r *outbox.Relay) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{relay: r, cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		if err := run.stop(); errors.Is(err, errNotStopped) {
			t.Error(err)
		}
	})
	return run
}

var errNotStopped = errors.New("the relay did not stop within a minute of its context's end")

// wait returns what Run returned, without ending it.
func (r *running) wait(timeout time.Duration) error {
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(timeout):
		return errors.New("the relay's Run did not return")
	}
}

func (r *running) stop() error {
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(time.Minute):
		return errNotStopped
	}
}

// committed returns the ids of every committed outbox record.
func (b *bed) committed(t testing.TB) []string {
	t.Helper()
	in, err := b.load.Inputs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return in.Committed
}

// rows counts the rows in the outbox table.
func (b *bed) rows(t testing.TB) int {
	t.Helper()
	var n int
	b.query(t, func(ctx context.Context) error {
		return b.pool.QueryRow(ctx, `SELECT count(*) FROM eoskit_outbox`).Scan(&n)
	})
	return n
}

// holder returns the backend pid reading the slot (0: none).
func (b *bed) holder(t testing.TB) int32 {
	t.Helper()
	var pid *int32
	b.query(t, func(ctx context.Context) error {
		return b.pool.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, b.slot).Scan(&pid)
	})
	if pid == nil {
		return 0
	}
	return *pid
}

// query runs q, again on a failure for up to 30 s: after a database
// restart, the pool's old connections fail once each.
func (b *bed) query(t testing.TB, q func(context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := q(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("query: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// verify reads the output topic and checks it: every committed record
// once, no rolled-back one, per key in commit order, nothing from an
// aborted Kafka transaction.
func (b *bed) verify(t *testing.T) verify.Report {
	t.Helper()
	in, err := b.load.Inputs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return b.k.VerifyInputs(in, b.out, 2*time.Minute)
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// published counts the committed records on the output topic now.
func (b *bed) published(t *testing.T) int {
	t.Helper()
	return len(b.k.ReadNow(b.out, kgo.ReadCommitted(), time.Minute))
}

// relayMain runs a relay from the environment until it is killed: its
// Kafka transactions stay open a while before they commit, so that a kill
// lands inside one.
func relayMain() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("EOS_RELAY_DB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 2
	}
	sem := eos.ExactlyOnce
	if os.Getenv("EOS_RELAY_SEMANTICS") == "at-least-once" {
		sem = eos.AtLeastOnce
	}
	opts := []outbox.Option{outbox.Brokers(strings.Split(os.Getenv("EOS_RELAY_BROKERS"), ",")...),
		outbox.PositionTopic(os.Getenv("EOS_RELAY_POSITIONS")), outbox.WithSemantics(sem),
		outbox.BeforeCommit(func() { time.Sleep(30 * time.Millisecond) })}
	if name := os.Getenv("EOS_RELAY_OUTBOX"); name != "" {
		opts = append(opts, outbox.Name(name))
	}
	r, err := outbox.NewRelay(pool, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	return 0
}

// values joins the records' values with commas, in order.
func values(recs []*kgo.Record) string {
	vals := make([]string, len(recs))
	for i, r := range recs {
		vals[i] = string(r.Value)
	}
	return strings.Join(vals, ",")
}
