package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
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
	if _, err := pool.Exec(ctx, `CREATE TABLE key_seq (k text PRIMARY KEY, seq bigint NOT NULL DEFAULT 0);
		CREATE TABLE ledger (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return &bed{k: k, pool: pool, url: url, slot: slot, out: k.NewTopic(6), positions: k.NewTopic(1)}
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
	cancel context.CancelFunc
	done   chan error
}

func (b *bed) start(t *testing.T, extra ...outbox.Option) *running {
	t.Helper()
	r, err := outbox.NewRelay(b.pool, b.opts(t, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- r.Run(ctx) }()
	t.Cleanup(func() { _ = run.stop() })
	return run
}

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
		return errors.New("the relay did not stop within a minute of its context's end")
	}
}

// written is what the writers rolled back on purpose; what they
// committed is in the ledger table (a commit cut by a database restart
// may have landed or not: the database knows).
type written struct {
	mu      sync.Mutex
	aborted []string
	failed  int           // transactions that failed other than on purpose
	took    time.Duration // from the first transaction to the last writer's end
	calls   int
}

func (w *written) rolledBack(ids []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.aborted = append(w.aborted, ids...)
}

// committed returns the ids of every committed outbox record.
func (b *bed) committed(t testing.TB) []string {
	t.Helper()
	var ids []string
	b.query(t, func(ctx context.Context) (err error) {
		rows, err := b.pool.Query(ctx, `SELECT id FROM ledger`)
		if err == nil {
			ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		return err
	})
	return ids
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

// write runs writers concurrent connections, each writing transactions
// until the total of committed records reaches n. A transaction writes 1
// to 3 keys (of keys), taking each key's next sequence number under its
// row lock, so that per key the sequence is the commit order; it sleeps a
// little (up to 3 ms) before committing, so that across keys the outbox ids commit out
// of order; one in ten rolls back. Values are id|key|seq, the verifier's
// copy format, with the key as the stream.
func (b *bed) write(ctx context.Context, n, writers, keys int, w *written) error {
	var total sync.Mutex
	remaining := n
	take := func(k int) int {
		total.Lock()
		defer total.Unlock()
		k = min(k, remaining)
		remaining -= k
		return k
	}
	giveBack := func(k int) {
		total.Lock()
		defer total.Unlock()
		remaining += k
	}
	w.mu.Lock()
	w.calls++
	call := w.calls // ids stay unique over several calls
	w.mu.Unlock()
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for wr := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(wr), 7))
			for i := 0; ; i++ {
				abort := rng.IntN(10) == 0
				count := 1 + rng.IntN(3)
				if !abort {
					if count = take(count); count == 0 {
						errs <- nil
						return
					}
				}
				picked := map[int]bool{}
				for len(picked) < count {
					picked[rng.IntN(keys)] = true
				}
				ks := make([]int, 0, count)
				for k := range picked {
					ks = append(ks, k)
				}
				slices.Sort(ks) // one lock order: no deadlocks
				var ids []string
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					ids = ids[:0]
					recs := make([]*kgo.Record, 0, count)
					for j, k := range ks {
						key := fmt.Sprintf("k%04d", k)
						var seq int64
						if err := tx.QueryRow(ctx, `INSERT INTO key_seq (k, seq) VALUES ($1, 1)
							ON CONFLICT (k) DO UPDATE SET seq = key_seq.seq + 1 RETURNING seq`, key).Scan(&seq); err != nil {
							return err
						}
						id := fmt.Sprintf("c%d-w%d-%d-%d", call, wr, i, j)
						ids = append(ids, id)
						recs = append(recs, &kgo.Record{Topic: b.out, Key: []byte(key), Value: fmt.Appendf(nil, "%s|%s|%d", id, key, seq)})
					}
					if err := outbox.Write(ctx, tx, recs...); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `INSERT INTO ledger SELECT unnest($1::text[])`, ids); err != nil {
						return err
					}
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
					if abort {
						return errRollback
					}
					return nil
				})
				switch {
				case errors.Is(err, errRollback):
					w.rolledBack(ids)
				case ctx.Err() != nil:
					errs <- ctx.Err()
					return
				case err != nil:
					// A database restart: whether a cut commit landed
					// is the ledger's to say; count it as not.
					w.mu.Lock()
					w.failed++
					w.mu.Unlock()
					if !abort {
						giveBack(count)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	began := time.Now()
	wg.Wait()
	w.mu.Lock()
	w.took = time.Since(began)
	w.mu.Unlock()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

var errRollback = errors.New("roll back on purpose")

// verify reads the output topic and checks it: every committed record
// once, no rolled-back one, per key in commit order, nothing from an
// aborted Kafka transaction.
func (b *bed) verify(t *testing.T, w *written) integration.Report {
	t.Helper()
	w.mu.Lock()
	aborted := slices.Clone(w.aborted)
	w.mu.Unlock()
	return b.k.VerifyInputs(integration.Inputs{Committed: b.committed(t), Aborted: aborted}, b.out, 2*time.Minute)
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
	r, err := outbox.NewRelay(pool, outbox.Brokers(strings.Split(os.Getenv("EOS_RELAY_BROKERS"), ",")...),
		outbox.PositionTopic(os.Getenv("EOS_RELAY_POSITIONS")), outbox.WithSemantics(sem),
		outbox.BeforeCommit(func() { time.Sleep(30 * time.Millisecond) }))
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
