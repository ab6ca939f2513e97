package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// Two services share one database, each with an outbox of its own
// (outbox.Name) and its relay in a child process, and one position topic.
// Each service writes (ids committing out of order, one transaction in ten
// rolled back), and each relay is SIGKILLed in turn inside an open Kafka
// transaction while its service's writers write, and started again. Each
// service's topic gets exactly its own committed records, once, per key
// in commit order; each outbox table ends empty. (With one outbox table for both, as before outboxes had
// names, each relay published the other's rows too: duplicates.)
func TestTwoServicesInOneDatabaseEachPublishTheirOwnOnce(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	pool, url := integration.PostgresWithURL(t)
	positions := k.NewTopic(1)
	services := []*service{newService(t, k, pool, url, positions, "billing"), newService(t, k, pool, url, positions, "shipping")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wrote := make([]chan error, len(services))
	relays := make([]*exec.Cmd, len(services))
	for i, s := range services {
		relays[i] = s.relayProcess(t)
	}
	// Each service's writers start when its relay's kill comes next, and
	// write until it came, so that the kill finds them writing: with a
	// fixed count, the writers were done (6,000 records in a few seconds)
	// before a relay slow to start under make test's load was killed.
	for i, s := range services {
		wrote[i] = make(chan error, 1)
		killed := make(chan struct{})
		go func() { wrote[i] <- s.load.run(ctx, 6000, 3, 20, killed) }()
		s.killAfter(t, relays[i], 1000)
		close(killed)
		relays[i] = s.relayProcess(t)
	}
	for i, s := range services {
		select {
		case err := <-wrote[i]:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s's writers did not finish within 2 minutes", s.name)
		}
		in := s.inputs(t)
		waitFor(t, 2*time.Minute, s.name+"'s committed records on its topic", func() bool { return s.published(t) >= len(in.Committed) })
	}
	for i, s := range services {
		_ = relays[i].Process.Signal(syscall.SIGTERM)
		_ = relays[i].Wait()
		t.Logf("%s: %v", s.name, s.k.VerifyInputs(s.inputs(t), s.out, 2*time.Minute))
		var left int
		s.query(t, func(ctx context.Context) error {
			return pool.QueryRow(ctx, `SELECT count(*) FROM eoskit_outbox_`+s.name).Scan(&left)
		})
		if left != 0 {
			t.Fatalf("%d rows left in %s's outbox table", left, s.name)
		}
	}
}

// service is one service of a shared database: its outbox, slot, topic,
// writers and relay processes.
type service struct {
	*bed
	name string
	load *serviceLoad
}

func newService(t *testing.T, k *integration.KafkaCluster, pool *pgxpool.Pool, url, positions, name string) *service {
	t.Helper()
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool, outbox.Name(name)); err != nil {
		t.Fatal(err)
	}
	slot, err := outbox.DefaultSlot(ctx, pool, outbox.Name(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropSlot(t, pool, slot) })
	w, err := outbox.NewWriter(outbox.Name(name))
	if err != nil {
		t.Fatal(err)
	}
	s := &service{bed: &bed{k: k, pool: pool, url: url, slot: slot, out: k.NewTopic(3), positions: positions}, name: name}
	if s.load, err = newServiceLoad(ctx, pool, name, s.out, w.Write); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *service) inputs(t *testing.T) integration.Inputs {
	t.Helper()
	in, err := s.load.inputs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// dropSlot drops a test's slot once its relays are gone: a slot blocks
// DROP DATABASE and keeps WAL.
func dropSlot(t *testing.T, pool *pgxpool.Pool, slot string) {
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
}

// relayProcess starts the service's relay in a child process (see
// TestMain), whose transactions stay open 30 ms before they commit.
func (s *service) relayProcess(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "EOS_TEST_RELAY=1", "EOS_RELAY_DB="+s.url, "EOS_RELAY_OUTBOX="+s.name,
		"EOS_RELAY_BROKERS="+strings.Join(s.k.Brokers, ","), "EOS_RELAY_POSITIONS="+s.positions)
	cmd.Stderr = os.Stderr
	integration.ChildProcess(t, cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// serviceLoad is one service's writers, like integration.OutboxLoad's
// (keys shared by concurrent transactions, each key's sequence taken
// under its row's lock, so that per key the sequence is the commit order
// while ids commit out of order; one transaction in ten rolled back) on
// tables of the service's own, written with its outbox's writer.
type serviceLoad struct {
	pool         *pgxpool.Pool
	seqs, ledger string
	topic        string
	write        func(context.Context, pgx.Tx, ...*kgo.Record) error

	mu      sync.Mutex
	aborted []string
}

func newServiceLoad(ctx context.Context, pool *pgxpool.Pool, name, topic string, write func(context.Context, pgx.Tx, ...*kgo.Record) error) (*serviceLoad, error) {
	l := &serviceLoad{pool: pool, seqs: name + "_key_seq", ledger: name + "_ledger", topic: topic, write: write}
	_, err := pool.Exec(ctx, `CREATE TABLE `+l.seqs+` (k text PRIMARY KEY, seq bigint NOT NULL);
		CREATE TABLE `+l.ledger+` (id text PRIMARY KEY)`)
	return l, err
}

// run commits n records from writers concurrent transactions over keys,
// and more until until is closed.
func (l *serviceLoad) run(ctx context.Context, n, writers, keys int, until <-chan struct{}) error {
	var mu sync.Mutex
	left := n
	take := func(k int) int {
		mu.Lock()
		defer mu.Unlock()
		if left > 0 {
			k = min(k, left)
			left -= k
			return k
		}
		select {
		case <-until:
			return 0
		default:
			return k
		}
	}
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 0))
			for i := 0; ; i++ {
				abort := rng.IntN(10) == 0
				count := 1 + rng.IntN(3)
				if !abort {
					if count = take(count); count == 0 {
						return
					}
				}
				ids, err := l.transaction(ctx, rng, fmt.Sprintf("%s-w%d-%d", l.topic, w, i), count, keys, abort)
				if errors.Is(err, errRollback) {
					l.mu.Lock()
					l.aborted = append(l.aborted, ids...)
					l.mu.Unlock()
					continue
				}
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

var errRollback = errors.New("rolled back on purpose")

func (l *serviceLoad) transaction(ctx context.Context, rng *rand.Rand, prefix string, count, keys int, abort bool) ([]string, error) {
	ks := rng.Perm(keys)[:count]
	slices.Sort(ks) // one lock order: no deadlocks
	var ids []string
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		ids = ids[:0]
		recs := make([]*kgo.Record, 0, count)
		for j, k := range ks {
			key := fmt.Sprintf("k%03d", k)
			var seq int64
			if err := tx.QueryRow(ctx, `INSERT INTO `+l.seqs+` (k, seq) VALUES ($1, 1)
				ON CONFLICT (k) DO UPDATE SET seq = `+l.seqs+`.seq + 1 RETURNING seq`, key).Scan(&seq); err != nil {
				return err
			}
			id := fmt.Sprintf("%s-%d", prefix, j)
			ids = append(ids, id)
			recs = append(recs, &kgo.Record{Topic: l.topic, Key: []byte(key), Value: fmt.Appendf(nil, "%s|%s|%d", id, key, seq)})
		}
		if err := l.write(ctx, tx, recs...); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+l.ledger+` SELECT unnest($1::text[])`, ids); err != nil {
			return err
		}
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
		if abort {
			return errRollback
		}
		return nil
	})
	return ids, err
}

// inputs returns what committed (the ledger) and what was rolled back.
func (l *serviceLoad) inputs(ctx context.Context) (integration.Inputs, error) {
	rows, err := l.pool.Query(ctx, `SELECT id FROM `+l.ledger)
	if err != nil {
		return integration.Inputs{}, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return integration.Inputs{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return integration.Inputs{Committed: ids, Aborted: slices.Clone(l.aborted)}, nil
}

// Migrate creates what it is given, and nothing else: with a Name, that
// outbox's table, publication and slot, and no default outbox or slot
// (which nobody would read, and which would keep the server's log for
// ever); with a Slot, that slot instead of the default one.
func TestMigrateCreatesOnlyWhatItIsGiven(t *testing.T) {
	t.Parallel()
	pool := integration.Postgres(t)
	ctx := context.Background()
	slots := func() []string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT slot_name::text FROM pg_replication_slots WHERE database = current_database() ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range names {
			t.Cleanup(func() { dropSlot(t, pool, s) })
		}
		return names
	}
	exists := func(table string) bool {
		t.Helper()
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	publications := func() string {
		t.Helper()
		var pubs string
		if err := pool.QueryRow(ctx, `SELECT coalesce(string_agg(pubname, ',' ORDER BY pubname), '') FROM pg_publication`).Scan(&pubs); err != nil {
			t.Fatal(err)
		}
		return pubs
	}

	billing := outbox.Name("billing")
	for range 2 { // idempotent
		if err := outbox.Migrate(ctx, pool, billing); err != nil {
			t.Fatal(err)
		}
	}
	want, err := outbox.DefaultSlot(ctx, pool, billing)
	if err != nil {
		t.Fatal(err)
	}
	if got := slots(); !slices.Equal(got, []string{want}) {
		t.Fatalf("after Migrate(Name(billing)) the database has slots %v; want only %s", got, want)
	}
	if exists(outbox.Table) || !exists("eoskit_outbox_billing") || !exists("eoskit_outbox_billing_dead_letters") {
		t.Fatal("Migrate(Name(billing)) did not create eoskit_outbox_billing and its dead letters only")
	}
	if got := publications(); got != "eoskit_outbox_billing" {
		t.Fatalf("publications %q; want eoskit_outbox_billing", got)
	}

	// The default outbox, read through a slot of the operator's naming.
	custom := fmt.Sprintf("eoskit_test_custom_%d", rand.Uint32()) // slot names are the server's
	if err := outbox.Migrate(ctx, pool, outbox.Slot(custom)); err != nil {
		t.Fatal(err)
	}
	if got := slots(); !slices.Equal(got, slices.Sorted(slices.Values([]string{want, custom}))) {
		t.Fatalf("after Migrate(Slot(%s)) the database has slots %v; want %s and %s only", custom, got, want, custom)
	}
	if !exists(outbox.Table) || publications() != "eoskit_outbox,eoskit_outbox_billing" {
		t.Fatalf("Migrate(Slot) did not create the default outbox: publications %q", publications())
	}
}

// A malformed Name or Slot is refused by every constructor that takes
// it, as an *eoskit.ConfigError naming the option, before anything reaches
// the server (the zero pool here would panic if used).
func TestMalformedNameIsRefusedWhereItIsGiven(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		bad     outbox.SlotOption
		setting string
	}{
		{outbox.Name("Billing"), "Name"},
		{outbox.Name(strings.Repeat("b", 37)), "Name"},
		{outbox.Name("billing_dead_letters"), "Name"},
		{outbox.Slot("billing-slot"), "Slot"},
	} {
		errs := map[string]error{}
		_, errs["NewRelay"] = outbox.NewRelay(new(pgxpool.Pool), outbox.Brokers("localhost:9092"), tc.bad)
		errs["Migrate"] = outbox.Migrate(ctx, new(pgxpool.Pool), tc.bad)
		_, errs["DefaultSlot"] = outbox.DefaultSlot(ctx, new(pgxpool.Pool), tc.bad)
		if n, ok := tc.bad.(outbox.NameOption); ok {
			_, errs["NewWriter"] = outbox.NewWriter(n)
		}
		for who, err := range errs {
			if cerr, ok := errors.AsType[*eoskit.ConfigError](err); !ok || cerr.Setting != tc.setting {
				t.Errorf("%s with a malformed %s: %v; want an *eoskit.ConfigError naming %s", who, tc.setting, err, tc.setting)
			}
		}
	}
}
