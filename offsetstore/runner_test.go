package offsetstore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/testsupport/testbed"
	"github.com/eoskit/eoskit/verify"
)

// TestMain doubles as the entry point of the loader processes that the
// crash test SIGKILLs.
func TestMain(m *testing.M) {
	if os.Getenv("EOS_TEST_LOADER") == "1" {
		os.Exit(loaderMain())
	}
	os.Exit(m.Run())
}

// The results table has no unique constraint, so a duplicate is a second
// row; seq records commit order, so order per partition can be checked.
const resultsDDL = `CREATE TABLE results (seq bigserial PRIMARY KEY, id text NOT NULL, part integer NOT NULL, off bigint NOT NULL)`

// load is the handler under test: the batch's rows in one COPY.
func load(stall func(recs []*kgo.Record)) offsetstore.Handler {
	return func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		if stall != nil {
			stall(recs)
		}
		rows := make([][]any, len(recs))
		for i, r := range recs {
			rows[i] = []any{string(r.Key), r.Partition, r.Offset}
		}
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"results"}, []string{"id", "part", "off"}, pgx.CopyFromRows(rows))
		return err
	}
}

func testClientOpts() []kgo.Opt {
	return []kgo.Opt{kgo.SessionTimeout(6 * time.Second), kgo.RebalanceTimeout(5 * time.Second)}
}

type bed struct {
	k      *integration.KafkaCluster
	parts  int           // the topic's partitions
	pool   *pgxpool.Pool // the test's own connections
	runner *pgxpool.Pool // the runners' connections; pool unless a test sets it
	dbURL  string
	topic  string
	group  string
	inputs []string
}

func newBed(t *testing.T, partitions int32, n int) *bed {
	t.Helper()
	return newBedOn(t, integration.Kafka(t), partitions, n)
}

func newBedOn(t *testing.T, k *integration.KafkaCluster, partitions int32, n int) *bed {
	t.Helper()
	b := &bed{k: k, parts: int(partitions)}
	b.pool, b.dbURL = integration.PostgresWithURL(t)
	b.topic = b.k.NewTopic(partitions)
	b.group = integration.UniqueName(t, "g")
	ctx := context.Background()
	if err := offsetstore.Migrate(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, resultsDDL); err != nil {
		t.Fatal(err)
	}
	b.inputs = b.k.Seed(b.topic, n)
	b.runner = b.pool
	return b
}

type running struct {
	r        *offsetstore.Runner
	cancel   context.CancelFunc
	finished chan struct{}
	err      error
}

func (b *bed) start(t *testing.T, h offsetstore.Handler, opts ...offsetstore.Option) *running {
	t.Helper()
	opts = append([]offsetstore.Option{offsetstore.Brokers(b.k.Brokers...), offsetstore.Group(b.group),
		offsetstore.Topics(b.topic), offsetstore.ClientOptions(testClientOpts()...)}, opts...)
	r, err := offsetstore.NewRunner(b.runner, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{r: r, cancel: cancel, finished: make(chan struct{})}
	go func() {
		defer close(run.finished)
		run.err = r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-run.finished
	})
	return run
}

func (run *running) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-run.finished:
		return run.err
	case <-time.After(timeout):
		t.Fatalf("runner did not return within %s", timeout)
		return nil
	}
}

func (run *running) stop(t *testing.T) {
	t.Helper()
	run.cancel()
	if err := run.wait(t, time.Minute); err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}
}

func (b *bed) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM results`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !waitUntil(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// waitUntil polls cond every 100 ms and reports whether it held before
// the timeout.
func waitUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// views returns the runners' Health.
func (b *bed) views(runs map[string]*running) []eoskit.Health {
	var hs []eoskit.Health
	for _, r := range runs {
		hs = append(hs, r.r.Health())
	}
	return hs
}

// explain describes, for a stalled wait's message, what each runner holds,
// what the group's coordinator says its members hold, and what every
// database session of the test's database is doing.
func (b *bed) explain(runs map[string]*running) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out strings.Builder
	for _, name := range slices.Sorted(maps.Keys(runs)) {
		h := runs[name].r.Health()
		fmt.Fprintf(&out, "runner %s: running %v, joined %v, assigned %v; ", name, h.Running, h.Joined, h.Assigned[b.topic])
	}
	if _, group, err := testbed.GroupSettled(ctx, b.k.Admin, b.group, b.topic, b.parts, b.views(runs)...); err != nil {
		fmt.Fprintf(&out, "group: %v; ", err)
	} else {
		out.WriteString(group + "; ")
	}
	// A connection of its own: the stall may hold the runners' pool.
	conn, err := pgx.Connect(ctx, b.dbURL)
	if err != nil {
		return out.String() + "sessions: " + err.Error()
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT pid, coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, ''),
		coalesce(extract(epoch FROM now() - xact_start)::int, -1), left(query, 80)
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	if err != nil {
		return out.String() + "sessions: " + err.Error()
	}
	defer rows.Close()
	for rows.Next() {
		var pid, age int
		var state, waitType, wait, query string
		if err := rows.Scan(&pid, &state, &waitType, &wait, &age, &query); err != nil {
			return out.String() + "sessions: " + err.Error()
		}
		fmt.Fprintf(&out, "session %d %s wait %s/%s in transaction %d s: %q; ", pid, state, waitType, wait, age, query)
	}
	if err := rows.Err(); err != nil {
		return out.String() + "sessions: " + err.Error()
	}
	st := b.pool.Stat()
	fmt.Fprintf(&out, "pool: %d of %d connections acquired", st.AcquiredConns(), st.MaxConns())
	return out.String()
}

// verify checks the results table with the verifier: every input exactly
// once, and per input partition in offset order of commit.
func (b *bed) verify(t *testing.T) verify.Report {
	t.Helper()
	rep, err := verify.CheckRows(context.Background(), b.pool, "results", b.inputs)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	return rep
}

// 100,000 records through three runners while runners leave and join. A
// runner's poll blocks the rebalance until its batch commits, so a join
// aborts nothing unless a batch outlasts the rebalance timeout: at each
// join one runner is held in its handler, inside its batch's transaction
// with its partitions' offsets rows claimed, past that timeout. The group
// moves those partitions on without it, and their new owner queues on the
// claimed rows; when the held batch commits, the new owner's commit must
// be refused (the rows moved: stale) and rewound. The table must still
// hold every input once, in order per partition. The test fails unless
// each leave and join happened with rows still to load, each join took
// partitions from a member (Rebalanced) and got a commit refused.
func TestExactlyOnceThroughRebalances(t *testing.T) {
	t.Parallel()
	const n = 100_000
	b := newBed(t, 6, n)
	type member struct {
		run     *running
		metrics *countingMetrics
	}
	var all []member // every runner started, stopped ones too
	hold := &holdOne{}
	// Paced while the churn lasts (2 ms a record, a second for a full
	// batch): unpaced, the load ends before the churn does.
	var paced atomic.Bool
	paced.Store(true)
	start := func(name string) *running {
		m := &countingMetrics{}
		loadRows := load(nil)
		h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
			hold.pass(ctx, name, recs)
			if paced.Load() {
				time.Sleep(time.Duration(len(recs)) * 2 * time.Millisecond)
			}
			return loadRows(ctx, tx, recs)
		}
		// Small fetches mix every partition into each poll: a new owner
		// reaches the held partition in its first batches, not after
		// the thousands of records buffered for its other partitions.
		run := b.start(t, h, offsetstore.WithMetrics(m), offsetstore.ClientOptions(kgo.FetchMaxPartitionBytes(16<<10)))
		all = append(all, member{run, m})
		return run
	}
	sum := func(f func(member) int64) (total int64) {
		for _, m := range all {
			total += f(m)
		}
		return total
	}
	refused := func(m member) int64 { return m.run.r.Stats().StaleRejected }
	staleAborts := func(m member) int64 { return int64(m.metrics.abortsFor("stale")) }
	revokes := func(m member) int64 { return m.metrics.rebalances.Load() }
	lockWaits := func() int {
		var waiting int
		if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	}

	runs := map[string]*running{"a": start("a"), "b": start("b"), "c": start("c")}
	churn := []struct{ leave, join string }{{"b", "d"}, {"a", "b"}, {"d", "e"}}
	var leaves, joins int
	for i, c := range churn {
		at := (i + 1) * n / 10
		waitFor(t, 3*time.Minute, fmt.Sprintf("%d rows", at), func() bool { return b.rows(t) >= at })
		runs[c.leave].stop(t)
		delete(runs, c.leave)
		// Rows only grow: fewer than n now, fewer when the leave happened.
		if rows := b.rows(t); rows >= n {
			t.Fatalf("round %d: %s left after every row was loaded (%d): no churn mid-stream", i, c.leave, rows)
		}
		leaves++
		// The leaver's partitions go to the others first, in a rebalance
		// the group ends before the join: a join during it would take
		// them, free, from no one.
		if !waitUntil(time.Minute, func() bool {
			settled, _, err := testbed.GroupSettled(context.Background(), b.k.Admin, b.group, b.topic, b.parts, b.views(runs)...)
			if err != nil {
				t.Fatal(err)
			}
			return settled
		}) {
			t.Fatalf("round %d: timed out after 1m0s waiting for the group to settle on the remaining runners, owning every partition: %s", i, b.explain(runs))
		}

		hold.arm()
		var heldBy string
		var heldParts []int32
		waitFor(t, time.Minute, "a runner to be held in its handler, mid-batch", func() bool {
			heldBy, heldParts = hold.held()
			return heldBy != ""
		})
		revokedBefore, refusedBefore, staleBefore := sum(revokes), sum(refused), sum(staleAborts)
		runs[c.join] = start(c.join)
		// Past the rebalance timeout the group gives the held batch's
		// partitions to others; the first to commit one queues on its
		// claimed row.
		if !waitUntil(2*time.Minute, func() bool { return lockWaits() > 0 }) {
			t.Fatalf("round %d: timed out after 2m0s waiting for the held batch's partitions' new owner to queue on their offsets rows: %s held %v; %s",
				i, heldBy, heldParts, b.explain(runs))
		}
		rows := b.rows(t)
		if rows >= n {
			t.Fatalf("round %d: %s joined after every row was loaded (%d)", i, c.join, rows)
		}
		joins++
		hold.release()
		waitFor(t, time.Minute, "the new owner's commit to be refused", func() bool { return sum(refused) > refusedBefore })
		waitFor(t, time.Minute, "a batch aborted as stale in the metrics", func() bool { return sum(staleAborts) > staleBefore })
		// The held runner, back, finds its partitions gone (or a
		// member gives some up to it): taken from a member either way.
		waitFor(t, time.Minute, "the join to take partitions from a member", func() bool { return sum(revokes) > revokedBefore })
		t.Logf("round %d: %s left and %s joined with %d of %d rows loaded; %s held partitions %v past the rebalance; commits refused so far: %d",
			i, c.leave, c.join, rows, n, heldBy, heldParts, sum(refused))
	}
	paced.Store(false)
	waitFor(t, 3*time.Minute, "every row", func() bool { return b.rows(t) >= n })
	for _, r := range runs {
		r.stop(t)
	}
	rep := b.verify(t)
	if leaves != len(churn) || joins != len(churn) {
		t.Fatalf("%d leaves and %d joins mid-stream, want %d of each", leaves, joins, len(churn))
	}
	if got := sum(refused); got < int64(len(churn)) {
		t.Fatalf("%d commits refused, want at least %d (one per join)", got, len(churn))
	}
	t.Logf("verifier: %v; leaves %d, joins %d; partitions taken from a member: %d times; commits refused: %d",
		rep, leaves, joins, sum(revokes), sum(refused))
}

// holdOne holds the first handler call that comes once armed, until
// released (or its ctx ends), and tells whose it is and its partitions.
type holdOne struct {
	mu    sync.Mutex
	armed bool
	freed chan struct{}
	by    string
	parts []int32
}

func (h *holdOne) arm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.freed, h.by, h.parts = true, make(chan struct{}), "", nil
}

func (h *holdOne) pass(ctx context.Context, name string, recs []*kgo.Record) {
	h.mu.Lock()
	if !h.armed {
		h.mu.Unlock()
		return
	}
	h.armed, h.by = false, name
	for _, r := range recs {
		if !slices.Contains(h.parts, r.Partition) {
			h.parts = append(h.parts, r.Partition)
		}
	}
	freed := h.freed
	h.mu.Unlock()
	select {
	case <-freed:
	case <-ctx.Done():
	}
}

func (h *holdOne) held() (string, []int32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.by, slices.Clone(h.parts)
}

func (h *holdOne) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.freed)
}

// countingMetrics counts what the tests assert on.
type countingMetrics struct {
	eoskit.NopMetrics
	rebalances atomic.Int64
	mu         sync.Mutex
	aborted    map[string]int
}

func (m *countingMetrics) Rebalanced() { m.rebalances.Add(1) }

func (m *countingMetrics) Aborted(reason string, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.aborted == nil {
		m.aborted = map[string]int{}
	}
	m.aborted[reason]++
}

func (m *countingMetrics) abortsFor(reason string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.aborted[reason]
}

// Kafka's committed offsets for the group are set wrong on purpose, ahead
// and behind: the runner ignores them, before and after the database has
// offsets of its own.
func TestKafkaCommittedOffsetsAreIgnored(t *testing.T) {
	t.Parallel()
	const n = 3000
	b := newBed(t, 2, n)
	commitKafka := func(at map[int32]int64) {
		t.Helper()
		offs := kadm.Offsets{}
		for p, o := range at {
			offs.Add(kadm.Offset{Topic: b.topic, Partition: p, At: o})
		}
		resp, err := b.k.Admin.CommitOffsets(context.Background(), b.group, offs)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	commitKafka(map[int32]int64{0: 1000, 1: 5}) // ahead: would skip records

	r := b.start(t, load(nil), offsetstore.MirrorToKafka())
	waitFor(t, 2*time.Minute, "every row", func() bool { return b.rows(t) >= n })
	r.stop(t)
	b.verify(t)

	// The mirror copied the database's offsets to Kafka.
	fetched, err := b.k.Admin.FetchOffsets(context.Background(), b.group)
	if err != nil {
		t.Fatal(err)
	}
	var mirrored int64
	fetched.Each(func(o kadm.OffsetResponse) { mirrored += o.At })
	if mirrored != n {
		t.Fatalf("mirrored offsets sum to %d, want %d", mirrored, n)
	}

	commitKafka(map[int32]int64{0: 0, 1: 0}) // behind: would redo everything
	again := b.start(t, load(nil))
	waitFor(t, time.Minute, "the second runner to be assigned both partitions", func() bool {
		return slices.Equal(again.r.Health().Assigned[b.topic], []int32{0, 1})
	})
	// One more record per partition: once both are loaded, the runner has
	// read past where it was positioned on each partition. Positioned from
	// Kafka's offsets (0), it would have loaded the first n again first.
	late := b.k.Client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for p := range int32(2) {
		id := fmt.Sprintf("late-%d", p)
		if err := late.ProduceSync(context.Background(), &kgo.Record{Topic: b.topic, Partition: p, Key: []byte(id), Value: []byte(id)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		b.inputs = append(b.inputs, id)
	}
	waitFor(t, 2*time.Minute, "the late records to be loaded", func() bool {
		var loaded int
		if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM results WHERE id LIKE 'late-%'`).Scan(&loaded); err != nil {
			t.Fatal(err)
		}
		return loaded >= 2
	})
	again.stop(t)
	if rows := b.rows(t); rows != n+2 {
		t.Fatalf("%d rows after the late records, want %d: the runner read from Kafka's offsets, not the database's", rows, n+2)
	}
	b.verify(t) // every input, the late ones too, once
}

// A runner stalls inside its batch's transaction (holding its partitions'
// offsets rows) past its rebalance timeout; a successor takes the
// partitions and queues on the rows, past the claim's lock timeout (its
// batch is retried, and no record blamed for the wait). When the stalled
// one wakes, whichever of the two holds a row first commits its batch, and
// the other's batch on that partition is refused (it finds the row moved)
// and rewound: every row lands once, in order, and neither Run fails.
//
// With Concurrency(2) each partition is a pipeline with transactions of
// its own: the zombie stalls in both partitions' batches, and a refused
// batch rewinds its partition to where the database stands.
func TestZombieCommitIsRejected(t *testing.T) {
	t.Parallel()
	for _, concurrency := range []int{1, 2} {
		t.Run(fmt.Sprintf("concurrency %d", concurrency), func(t *testing.T) {
			t.Parallel()
			zombieCommitIsRejected(t, offsetstore.Concurrency(concurrency))
		})
	}
}

func zombieCommitIsRejected(t *testing.T, concurrency offsetstore.Option) {
	const n = 5000
	b := newBed(t, 2, n)
	stalled := make(chan struct{})
	wake := make(chan struct{})
	var once sync.Once
	// Every batch stalls until wake: under Concurrency(2) each partition
	// is a pipeline of its own, and one that stalled alone would leave
	// the zombie working on, giving up only its idle partition.
	zombie := b.start(t, load(func(recs []*kgo.Record) {
		select {
		case <-wake:
		default:
			once.Do(func() { close(stalled) })
			<-wake
		}
	}), offsetstore.MaxRecordsPerCommit(100), concurrency)
	select {
	case <-stalled:
	case <-time.After(time.Minute):
		t.Fatal("the zombie never stalled")
	}

	successor := b.start(t, load(nil), offsetstore.MaxRecordsPerCommit(100), concurrency)
	waitFor(t, 2*time.Minute, "the successor to queue on the zombie's row lock", func() bool {
		var waiting int
		if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting > 0
	})
	time.Sleep(11 * time.Second) // past the 10 s lock timeout of a claim
	close(wake)
	refused := func() int64 { return zombie.r.Stats().StaleRejected + successor.r.Stats().StaleRejected }
	waitFor(t, time.Minute, "one of the two commits to be refused", func() bool { return refused() > 0 })
	waitFor(t, 2*time.Minute, "every row", func() bool { return b.rows(t) >= n })
	zombie.stop(t)
	successor.stop(t)
	t.Logf("verifier: %v; commits refused: zombie %d, successor %d", b.verify(t), zombie.r.Stats().StaleRejected, successor.r.Stats().StaleRejected)
}

// The runner's database connections are terminated (pg_terminate_backend)
// again and again while it loads: it reconnects, and the table is still
// exactly once.
func TestDatabaseConnectionsKilledDuringTheRun(t *testing.T) {
	t.Parallel()
	const n = 20_000
	b := newBed(t, 3, n)
	// The runner gets connections of its own, named, so that only they are
	// terminated and the test can keep counting rows.
	runnerPool, err := pgxpool.New(context.Background(), b.dbURL+"&application_name=eoskit-runner")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runnerPool.Close)
	b.runner = runnerPool
	r := b.start(t, load(func([]*kgo.Record) { time.Sleep(10 * time.Millisecond) }), offsetstore.MaxRecordsPerCommit(100))

	admin, err := pgx.Connect(context.Background(), b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	killed := 0
	for round := 0; b.rows(t) < n && round < 200; round++ {
		var k int
		if err := admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'eoskit-runner'`).Scan(&k); err != nil {
			t.Fatal(err)
		}
		killed += k
		// Every 400 ms: often enough to kill many batches, not so often
		// that each of a batch's 10 retries (about 9 s of backoff) finds
		// its connections dead, after which the runner rightly gives up.
		time.Sleep(400 * time.Millisecond)
	}
	waitFor(t, 2*time.Minute, "every row, or Run to return", func() bool {
		select {
		case <-r.finished:
			return true
		default:
			return b.rows(t) >= n
		}
	})
	select {
	case <-r.finished:
		t.Fatalf("the runner gave up: %v", r.err)
	default:
	}
	r.stop(t)
	if killed < 5 {
		t.Fatalf("terminated only %d backends; the fault did not happen", killed)
	}
	t.Logf("verifier: %v; backends terminated: %d", b.verify(t), killed)
}

func TestDeadLetterAndStopPolicies(t *testing.T) {
	t.Parallel()
	const n = 1000
	b := newBed(t, 1, n)
	poison := func(r *kgo.Record) bool { return strings.HasSuffix(string(r.Key), "37") }
	h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		for _, r := range recs {
			if poison(r) {
				return errors.New("poison " + string(r.Key))
			}
		}
		return load(nil)(ctx, tx, recs)
	}

	// Mirrored: the 37 records committed before the stop have their
	// offsets in Kafka too, once Run returned.
	stopper := b.start(t, h, offsetstore.MirrorToKafka())
	err := stopper.wait(t, time.Minute)
	var rerr *eoskit.RecordError
	if !errors.As(err, &rerr) || rerr.Topic != b.topic || rerr.Offset != 37 {
		t.Fatalf("Run = %v, want a *RecordError at offset 37", err)
	}
	if got := b.rows(t); got != 37 {
		t.Fatalf("%d rows after stopping at offset 37, want the 37 before it", got)
	}
	fetched, err := b.k.Admin.FetchOffsets(context.Background(), b.group)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := fetched.Lookup(b.topic, 0); !ok || o.At != 37 {
		t.Fatalf("Kafka holds offset %d (found: %v) for the group after the stop, want 37: the mirror missed the records committed before it", o.At, ok)
	}

	parker := b.start(t, h, offsetstore.OnHandlerError(offsetstore.DeadLetter()))
	var want []string
	for _, id := range b.inputs {
		if !strings.HasSuffix(id, "37") {
			want = append(want, id)
		}
	}
	waitFor(t, time.Minute, "the good rows", func() bool { return b.rows(t) >= len(want) })
	waitFor(t, time.Minute, "the dead letters", func() bool { return parker.r.Stats().DeadLetters >= int64(n-len(want)) })
	parker.stop(t)
	b.inputs = want
	b.verify(t)
	var dead, distinct int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT "offset") FROM eoskit_dead_letters WHERE error LIKE 'poison%'`).Scan(&dead, &distinct); err != nil {
		t.Fatal(err)
	}
	if dead != n-len(want) || distinct != dead {
		t.Fatalf("%d dead letters (%d distinct), want %d", dead, distinct, n-len(want))
	}
}

// Partitions commit at once, a database transaction each, on input from a
// transactional producer that also aborts, over six partitions, while a
// second runner joins and the first leaves: every committed record is
// applied once, in offset order per partition, nothing aborted is applied,
// and batches did run at once, never more than the bound.
func TestConcurrentPartitionsExactlyOnce(t *testing.T) {
	t.Parallel()
	b := newBed(t, 6, 0)
	committed, aborted, err := integration.SeedTransactional(context.Background(), b.k.Brokers, b.topic, 6000, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	type inFlight struct{ now, max atomic.Int64 }
	handler := func(f *inFlight) offsetstore.Handler {
		return func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
			n := f.now.Add(1)
			defer f.now.Add(-1)
			for m := f.max.Load(); n > m && !f.max.CompareAndSwap(m, n); m = f.max.Load() {
			}
			time.Sleep(time.Duration(len(recs)) * 200 * time.Microsecond)
			return load(nil)(ctx, tx, recs)
		}
	}
	var fa, fb inFlight
	// Polls large enough to span partitions (franz-go fills a poll
	// partition by partition; each holds ~1,000 records).
	a := b.start(t, handler(&fa), offsetstore.Concurrency(3), offsetstore.MaxRecordsPerCommit(3000))
	waitFor(t, 2*time.Minute, "a third of the rows", func() bool { return b.rows(t) >= len(committed)/3 })
	second := b.start(t, handler(&fb), offsetstore.Concurrency(3), offsetstore.MaxRecordsPerCommit(3000))
	waitFor(t, 2*time.Minute, "two thirds of the rows", func() bool { return b.rows(t) >= 2*len(committed)/3 })
	a.stop(t)
	waitFor(t, 2*time.Minute, "every row", func() bool {
		select {
		case <-second.finished:
			t.Fatalf("the second runner returned %v before every row was in", second.err)
		default:
		}
		return b.rows(t) >= len(committed)
	})
	time.Sleep(time.Second) // and the aborted transactions after the last committed ones
	second.stop(t)
	outs, err := verify.ReadRows(context.Background(), b.pool, "results")
	if err != nil {
		t.Fatal(err)
	}
	rep := verify.Check(verify.Run{Input: committed, Output: outs, AbortedInput: aborted})
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if fa.max.Load() < 2 || fa.max.Load() > 3 || fb.max.Load() > 3 {
		t.Errorf("batches at once: at most %d (first) and %d (second); want the first above 1 and neither above the bound, 3", fa.max.Load(), fb.max.Load())
	}
	t.Logf("verifier: %v; batches at once: %d, %d", rep, fa.max.Load(), fb.max.Load())
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	pool := integration.Postgres(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- offsetstore.Migrate(context.Background(), pool)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var versions, max int
	if err := pool.QueryRow(context.Background(), `SELECT count(*), max(version) FROM eoskit_offsetstore_schema`).Scan(&versions, &max); err != nil {
		t.Fatal(err)
	}
	if versions != offsetstore.SchemaVersion || max != offsetstore.SchemaVersion {
		t.Fatalf("schema has %d version rows, newest %d; want each migration applied once up to %d", versions, max, offsetstore.SchemaVersion)
	}
}

// Loader processes are SIGKILLed three times at random points of a run in
// which most of the time is spent inside database transactions; each
// restart must resume from the stored offsets.
func TestCrashesAroundTheDatabaseCommit(t *testing.T) {
	t.Parallel()
	const n = 20_000
	b := newBed(t, 3, n)
	for kill := 0; kill < 3; kill++ {
		before := b.rows(t)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "EOS_TEST_LOADER=1", "EOS_LOADER_BROKERS="+strings.Join(b.k.Brokers, ","),
			"EOS_LOADER_DB="+b.dbURL, "EOS_LOADER_GROUP="+b.group, "EOS_LOADER_TOPIC="+b.topic)
		cmd.Stderr = os.Stderr
		integration.ChildProcess(t, cmd)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "the loader to make progress", func() bool { return b.rows(t) > before+500 })
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	r := b.start(t, load(nil))
	waitFor(t, 2*time.Minute, "every row", func() bool { return b.rows(t) >= n })
	r.stop(t)
	t.Logf("verifier: %v", b.verify(t))
}

// loaderMain runs a runner whose transactions each take a while, until it
// is killed.
func loaderMain() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("EOS_LOADER_DB"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "loader:", err)
		return 2
	}
	r, err := offsetstore.NewRunner(pool, load(func([]*kgo.Record) { time.Sleep(20 * time.Millisecond) }),
		offsetstore.Brokers(strings.Split(os.Getenv("EOS_LOADER_BROKERS"), ",")...),
		offsetstore.Group(os.Getenv("EOS_LOADER_GROUP")), offsetstore.Topics(os.Getenv("EOS_LOADER_TOPIC")),
		offsetstore.MaxRecordsPerCommit(100), offsetstore.ClientOptions(testClientOpts()...))
	if err != nil {
		fmt.Fprintln(os.Stderr, "loader:", err)
		return 2
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "loader:", err)
		return 1
	}
	return 0
}

// The input is written by a transactional producer upstream that aborts
// every other transaction, over three partitions: only the committed
// records may reach the results. Before the runner read with
// read_committed, every aborted record was applied.
func TestAbortedInputsAreNeverApplied(t *testing.T) {
	t.Parallel()
	b := newBed(t, 3, 0)
	ctx := context.Background()
	committed, aborted, err := integration.SeedTransactional(ctx, b.k.Brokers, b.topic, 3000, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := b.start(t, load(nil), offsetstore.MaxRecordsPerCommit(250))
	// Aborted transactions sit between committed ones in every partition:
	// once every committed record is in, a runner that applies aborted
	// ones has applied all but the last few.
	waitFor(t, 2*time.Minute, "every committed record", func() bool { return b.rows(t) >= len(committed) })
	time.Sleep(2 * time.Second) // and the aborted transactions after the last committed ones
	r.stop(t)
	outs, err := verify.ReadRows(ctx, b.pool, "results")
	if err != nil {
		t.Fatal(err)
	}
	rep := verify.Check(verify.Run{Input: committed, Output: outs, AbortedInput: aborted})
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d committed and %d aborted inputs; verifier: %v", len(committed), len(aborted), rep)
}

// A zombie owner commits the next record of the partition (its row and the
// offset past it) between the runner's poll and its commit. The results
// table has a natural key, as in the package doc, so running the handler on
// that record again fails with a unique violation. The stale batch must be
// refused before the handler runs, and the run go on with nothing lost or
// applied twice. Before the offset check came first, the handler's unique
// violation was taken for a poison record and, under Stop, Run returned a
// *eoskit.RecordError blaming a valid record.
func TestStaleBatchIsRefusedBeforeTheHandlerRuns(t *testing.T) {
	t.Parallel()
	const n = 2000
	b := newBed(t, 1, n)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `ALTER TABLE results ADD CONSTRAINT results_id_unique UNIQUE (id)`); err != nil {
		t.Fatal(err)
	}
	ids := map[int64]string{}
	for _, r := range b.k.ReadAll(b.topic, kgo.ReadCommitted(), time.Minute) {
		ids[r.Offset] = string(r.Key)
	}
	// The runner's own pool: the zombie strikes as the runner takes a
	// connection, after its first commit.
	var struck atomic.Int64
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		if struck.Load() != 0 {
			return true, nil
		}
		var next int64
		if err := b.pool.QueryRow(ctx, `SELECT next_offset FROM eoskit_offsets WHERE consumer_group = $1`, b.group).Scan(&next); err != nil || next >= n {
			return true, nil // nothing committed yet, or nothing left
		}
		struck.Store(next)
		_, err := b.zombieCommits(ctx, ids[next], next)
		return err == nil, err
	}
	b.runnerPoolWith(t, cfg)

	r := b.start(t, load(nil), offsetstore.MaxRecordsPerCommit(100))
	waitFor(t, 2*time.Minute, "every row, or the runner to stop", func() bool {
		select {
		case <-r.finished:
			return true
		default:
			return b.rows(t) >= n
		}
	})
	r.stop(t)
	if struck.Load() == 0 {
		t.Fatal("the zombie never committed")
	}
	if r.r.Stats().StaleRejected == 0 {
		t.Fatal("no batch was refused; the zombie's commit went unnoticed")
	}
	t.Logf("zombie committed offset %d first; refused: %d; verifier: %v", struck.Load(), r.r.Stats().StaleRejected, b.verify(t))
}

// A zombie owner commits a partition's next record after the runner polled
// a batch holding records of that partition and of another, and before
// its commit: the batch is refused whole, and every partition it held must
// go back to its stored position. Before, only the refused partition was
// rewound: the other's records of the batch were skipped, and the next
// batch moved their offsets over them, never applied.
func TestRefusedBatchRewindsEveryPartitionItHeld(t *testing.T) {
	t.Parallel()
	const n = 4000
	b := newBed(t, 2, 0)
	ctx := context.Background()
	// Small record batches and small fetches, so that polls hold records
	// of both partitions.
	seeder := b.k.Client(kgo.DefaultProduceTopic(b.topic), kgo.ProducerBatchMaxBytes(1<<10))
	for i := range n {
		id := fmt.Sprintf("in-%d", i)
		b.inputs = append(b.inputs, id)
		seeder.Produce(ctx, &kgo.Record{Key: []byte(id), Value: []byte(id)}, func(_ *kgo.Record, err error) {
			if err != nil {
				t.Errorf("seed: %v", err)
			}
		})
	}
	if err := seeder.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// polled notes what the runner's last poll handed it; the zombie
	// strikes when the runner then takes a connection to commit.
	polled := &pollNotes{}
	var struck atomic.Bool
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		first, mixed := polled.take()
		if struck.Load() || !mixed || first == nil || first.Offset == 0 {
			return true, nil
		}
		moved, err := b.zombieCommits(ctx, string(first.Key), first.Offset)
		if moved {
			struck.Store(true)
		}
		return err == nil, err
	}
	b.runnerPoolWith(t, cfg)

	r := b.start(t, load(nil), offsetstore.MaxRecordsPerCommit(500),
		offsetstore.ClientOptions(kgo.FetchMaxPartitionBytes(4<<10), kgo.WithHooks(polled)))
	// The stored offsets reach the end of the log whether records were
	// applied or skipped: the verifier tells which.
	waitFor(t, 2*time.Minute, "the stored offsets to reach the end of the log", func() bool {
		var stored int64
		if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM eoskit_offsets WHERE consumer_group = $1`, b.group).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		return stored >= n
	})
	r.stop(t)
	if !struck.Load() {
		t.Fatal("no batch held records of both partitions; the zombie never struck")
	}
	if r.r.Stats().StaleRejected == 0 {
		t.Fatal("the batch the zombie struck was not refused")
	}
	t.Logf("refused: %d; verifier: %v", r.r.Stats().StaleRejected, b.verify(t))
}

// A topic is deleted and created again under the same name (a cleanup
// script, a reset) and gets more records than the old one had: the offset
// stored for the old topic must not be applied to the new one, which is
// read from its start. Before topic IDs were stored, the runner resumed at
// the old offset and skipped the new topic's first 500 records.
func TestRecreatedTopicIsReadFromItsStart(t *testing.T) {
	t.Parallel()
	const before, after = 500, 800
	b := newBed(t, 1, before)
	r := b.start(t, load(nil))
	waitFor(t, time.Minute, "the first topic's rows", func() bool { return b.rows(t) >= before })
	r.stop(t)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := b.k.Admin.DeleteTopics(ctx, b.topic); err != nil {
		t.Fatal(err)
	}
	for { // deletion completes in the background
		resp, err := b.k.Admin.CreateTopic(ctx, 1, 1, nil, b.topic)
		if err == nil && resp.Err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("recreate %s: %v %v", b.topic, err, resp.Err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	seeder := b.k.Client(kgo.DefaultProduceTopic(b.topic))
	var again []string
	for i := range after {
		id := fmt.Sprintf("again-%d", i)
		again = append(again, id)
		if err := seeder.ProduceSync(ctx, &kgo.Record{Key: []byte(id), Value: []byte(id)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	r = b.start(t, load(nil))
	waitFor(t, time.Minute, "the stored offset to reach the new topic's end", func() bool {
		var next int64
		_ = b.pool.QueryRow(ctx, `SELECT next_offset FROM eoskit_offsets WHERE consumer_group = $1`, b.group).Scan(&next)
		return next >= after
	})
	r.stop(t)
	outs, err := verify.ReadRows(ctx, b.pool, "results")
	if err != nil {
		t.Fatal(err)
	}
	for i := range outs { // the new topic's partition is another stream, its offsets from 0 again
		if strings.HasPrefix(outs[i].ID, "again-") {
			outs[i].Stream = "new topic " + outs[i].Stream
		}
	}
	rep := verify.Check(verify.Run{Input: append(append([]string(nil), b.inputs...), again...), Output: outs})
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("verifier (both topics): %v", rep)
}

// A handler that panics on one record: the batch rolls back, the record is
// found by splitting, and under Stop Run returns a *eoskit.RecordError naming it;
// a runner with a fixed handler then applies everything once. Before, the
// panic ended the process.
func TestHandlerPanicStopsRunNamingTheRecord(t *testing.T) {
	t.Parallel()
	const n, bad = 300, 120
	b := newBed(t, 1, n)
	panicky := load(func(recs []*kgo.Record) {
		for _, r := range recs {
			if r.Offset == bad {
				panic("cannot parse " + string(r.Key))
			}
		}
	})
	r := b.start(t, panicky)
	err := r.wait(t, time.Minute)
	var rerr *eoskit.RecordError
	if !errors.As(err, &rerr) || rerr.Offset != bad || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("Run returned %v; want a *RecordError for offset %d saying the handler panicked", err, bad)
	}
	fixed := b.start(t, load(nil))
	waitFor(t, time.Minute, "every row", func() bool { return b.rows(t) >= n })
	fixed.stop(t)
	t.Logf("Run: %v; verifier: %v", err, b.verify(t))
}

// zombieCommits does what a zombie owner of partition 0 does when it
// commits the record at offset first: writes its row and moves the stored
// offset past it, if the offset is still there. It reports whether it did.
func (b *bed) zombieCommits(ctx context.Context, id string, offset int64) (bool, error) {
	tag, err := b.pool.Exec(ctx, `WITH moved AS (UPDATE eoskit_offsets SET next_offset = $3 + 1, owner = 'zombie'
			WHERE consumer_group = $1 AND partition = 0 AND next_offset = $3 RETURNING 1)
		INSERT INTO results (id, part, off) SELECT $2, 0, $3 FROM moved`, b.group, id, offset)
	return err == nil && tag.RowsAffected() == 1, err
}

// runnerPoolWith gives the bed's runners a pool of their own, built from
// cfg (with a PrepareConn hook, say).
func (b *bed) runnerPoolWith(t *testing.T, cfg *pgxpool.Config) {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b.runner = pool
}

// pollNotes is a franz-go hook noting the records a poll hands out: the
// first of partition 0, and whether partition 1 came too.
type pollNotes struct {
	mu    sync.Mutex
	first *kgo.Record
	other bool
}

func (p *pollNotes) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if !polled {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case r.Partition == 0 && p.first == nil:
		p.first = r
	case r.Partition == 1:
		p.other = true
	}
}

// take returns and forgets what was noted since the last take.
func (p *pollNotes) take() (first *kgo.Record, mixed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	first, mixed = p.first, p.first != nil && p.other
	p.first, p.other = nil, false
	return first, mixed
}

// A database whose offsetstore schema is missing or older than the code's
// is refused at Run with a configuration error that says to migrate, not
// failed on at every assignment.
func TestRunRefusesAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	pool := integration.Postgres(t)
	r, err := offsetstore.NewRunner(pool, load(nil), offsetstore.Brokers("127.0.0.1:1"), offsetstore.Group("g"), offsetstore.Topics("t"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background()); !errors.Is(err, eoskit.ErrInvalidConfig) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Run on an unmigrated database returned %v; want ErrInvalidConfig saying to run Migrate", err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	h := load(nil)
	pool := &pgxpool.Pool{}
	base := []offsetstore.Option{offsetstore.Brokers("127.0.0.1:1"), offsetstore.Group("g"), offsetstore.Topics("t")}
	for name, opts := range map[string][]offsetstore.Option{
		"no brokers":                    {offsetstore.Group("g"), offsetstore.Topics("t")},
		"no group":                      {offsetstore.Brokers("b:1"), offsetstore.Topics("t")},
		"no topics":                     {offsetstore.Brokers("b:1"), offsetstore.Group("g")},
		"zero poll":                     append(base, offsetstore.MaxRecordsPerCommit(0)),
		"negative backoff":              append(base, offsetstore.OnHandlerError(eoskit.Retry(-1, 3))),
		"negative attempts":             append(base, offsetstore.OnHandlerError(eoskit.Retry(time.Millisecond, -1))),
		"endless retry with a fallback": append(base, offsetstore.OnHandlerError(eoskit.Retry(time.Millisecond, 0).Then(offsetstore.DeadLetter()))),
		"fallback on a dead letter":     append(base, offsetstore.OnHandlerError(offsetstore.DeadLetter().Then(eoskit.Stop()))),
		"read uncommitted":              append(base, offsetstore.ClientOptions(kgo.FetchIsolationLevel(kgo.ReadUncommitted()))),
		"group through ClientOptions":   append(base, offsetstore.ClientOptions(kgo.ConsumerGroup("other"))),
		"topics through ClientOptions":  append(base, offsetstore.ClientOptions(kgo.ConsumeTopics("other"))),
		"offsets adjusted through ClientOptions": append(base, offsetstore.ClientOptions(kgo.AdjustFetchOffsetsFn(
			func(_ context.Context, m map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
				return m, nil
			}))),
		"zero concurrency": append(base, offsetstore.Concurrency(0)),
		"a dead letter to a topic": append(base, offsetstore.OnHandlerError(eoskit.Classify(eoskit.Stop(),
			eoskit.When(io.EOF, eoskit.DeadLetterTo("orders-dlq"))))),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := offsetstore.NewRunner(pool, h, opts...)
			// One type for every runner's refusal: *eoskit.ConfigError.
			var cerr *eoskit.ConfigError
			if !errors.Is(err, eoskit.ErrInvalidConfig) || !errors.As(err, &cerr) || cerr.Setting == "" {
				t.Fatalf("NewRunner = %v, want a *ConfigError naming the setting", err)
			}
			if strings.Contains(name, "dead letter") && cerr.Setting != "OnHandlerError" {
				t.Fatalf("NewRunner = %v, want OnHandlerError named", err)
			}
		})
	}
	// The control: base alone, and a dead letter to the table, are taken.
	if _, err := offsetstore.NewRunner(pool, h, append(base, offsetstore.OnHandlerError(eoskit.Retry(time.Millisecond, 2).Then(offsetstore.DeadLetter())))...); err != nil {
		t.Fatalf("NewRunner with a table dead letter = %v, want nil", err)
	}
	if _, err := offsetstore.NewRunner(nil, h, base...); !errors.Is(err, eoskit.ErrInvalidConfig) {
		t.Fatalf("NewRunner(nil pool) = %v, want ErrInvalidConfig", err)
	}
}

// The broker is killed with SIGKILL while the runner loads, stays down for
// 35 s, and is started on the same data: fetches and the group fail that
// long, the runner rides it out (Run never returns) and carries on from the
// stored offsets, and the table is still exactly once.
func TestBrokerHardRestartDuringTheRun(t *testing.T) {
	t.Parallel()
	const n = 20_000
	broker := testbed.StartLocalBroker(t)
	b := newBedOn(t, broker.KafkaCluster, 3, n)
	r := b.start(t, load(func([]*kgo.Record) { time.Sleep(5 * time.Millisecond) }), offsetstore.MaxRecordsPerCommit(100))
	waitFor(t, 2*time.Minute, "30% of the rows", func() bool { return b.rows(t) >= n*3/10 })
	atKill := b.rows(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := broker.Outage(ctx, testbed.LongOutage); err != nil {
		t.Fatalf("outage: %v (broker log: %s)", err, broker.Log())
	}
	select {
	case <-r.finished:
		t.Fatalf("Run returned %v through the outage", r.err)
	default:
	}
	if atKill >= n {
		t.Fatal("the load had finished before the broker was killed")
	}
	waitFor(t, 3*time.Minute, "every row", func() bool { return b.rows(t) >= n })
	r.stop(t)
	t.Logf("verifier: %v; broker killed with %d of %d rows loaded", b.verify(t), atKill, n)
}

// A handler waits on an application row lock that another connection
// holds for 15 s, longer than the claim's lock timeout (10 s): the claim's
// timeout ends with the claim, so the handler waits, and its record is
// applied once, with nothing dead-lettered. Before, the claim's SET LOCAL
// lock_timeout governed the whole transaction: the handler's UPDATE failed
// with 55P03 after 10 s, the error was blamed on the record, and
// DeadLetter parked a valid record whose effect was never applied.
func TestHandlerWaitsOnARowLockPastTheClaimTimeout(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1, 1)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE accounts (id integer PRIMARY KEY, n bigint NOT NULL); INSERT INTO accounts VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
	locker, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if _, err := locker.Exec(ctx, `SELECT n FROM accounts WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET n = n + $1 WHERE id = 1`, len(recs)); err != nil {
			return err
		}
		return load(nil)(ctx, tx, recs)
	}
	r := b.start(t, h, offsetstore.OnHandlerError(offsetstore.DeadLetter()))
	waitFor(t, time.Minute, "the handler to wait on the row lock", func() bool {
		var waiting int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE 'UPDATE accounts%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting == 1
	})
	time.Sleep(15 * time.Second)
	if err := locker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the record to be applied or parked", func() bool {
		select {
		case <-r.finished:
			return true
		default:
			return r.r.Stats().Records >= 1
		}
	})
	select {
	case <-r.finished:
		t.Fatalf("Run returned %v while the handler waited on a row lock", r.err)
	default:
	}
	var n, dead int
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT n FROM accounts WHERE id = 1), (SELECT count(*) FROM eoskit_dead_letters)`).Scan(&n, &dead); err != nil {
		t.Fatal(err)
	}
	if n != 1 || dead != 0 || r.r.Stats().DeadLetters != 0 {
		t.Fatalf("the account was updated %d times and %d records dead-lettered (Stats %+v); want the record applied once, none parked", n, dead, r.r.Stats())
	}
	r.stop(t)
	b.verify(t)
}

// The handler runs under the lock timeout its connection had before the
// claim (here the pool's, 3 s), not the claim's 10 s and not none: the
// claim puts the value it found back. Before, the handler saw the claim's
// "10s".
func TestHandlerRunsUnderItsConnectionsLockTimeout(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1, 1)
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "3s"
	b.runnerPoolWith(t, cfg)
	seen := make(chan string, 1)
	r := b.start(t, func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		var lt string
		if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&lt); err != nil {
			return err
		}
		select {
		case seen <- lt:
		default:
		}
		return load(nil)(ctx, tx, recs)
	})
	select {
	case lt := <-seen:
		if lt != "3s" {
			t.Fatalf("the handler ran under lock_timeout %q; want the connection's own, 3s", lt)
		}
	case <-time.After(time.Minute):
		t.Fatal("the handler never ran")
	}
	waitFor(t, time.Minute, "the row", func() bool { return b.rows(t) >= 1 })
	r.stop(t)
	b.verify(t)
}

// A handler's error whose text PostgreSQL refuses as text (a NUL byte,
// bytes that are not UTF-8) is parked under DeadLetter like any other, its
// text made valid (a NUL, and each run of bytes that are not UTF-8, as
// U+FFFD), and the runner goes on. Before, the dead letter's INSERT failed
// (SQLSTATE 22021) at every attempt, and Run returned "parking ... failed
// 10 times".
func TestDeadLetterWithAnErrorTextPostgreSQLRefuses(t *testing.T) {
	t.Parallel()
	const n = 20
	b := newBed(t, 1, n)
	bad := b.inputs[7]
	h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		for _, r := range recs {
			if string(r.Key) == bad {
				return errors.New("refused\x00 record \xff" + bad)
			}
		}
		return load(nil)(ctx, tx, recs)
	}
	r := b.start(t, h, offsetstore.OnHandlerError(offsetstore.DeadLetter()))
	waitFor(t, time.Minute, "the good rows and the dead letter, or Run to return", func() bool {
		select {
		case <-r.finished:
			return true
		default:
			return b.rows(t) >= n-1 && r.r.Stats().DeadLetters >= 1
		}
	})
	select {
	case <-r.finished:
		t.Fatalf("Run returned %v; want the record parked and the run going on", r.err)
	default:
	}
	r.stop(t)
	var text string
	var key []byte
	if err := b.pool.QueryRow(context.Background(), `SELECT error, key FROM eoskit_dead_letters`).Scan(&text, &key); err != nil {
		t.Fatal(err)
	}
	if want := "refused\uFFFD record \uFFFD" + bad; text != want || string(key) != bad {
		t.Fatalf("dead letter of %q reads %q; want %q", key, text, want)
	}
	b.inputs = slices.DeleteFunc(slices.Clone(b.inputs), func(id string) bool { return id == bad })
	b.verify(t)
}

// Under Concurrency(4), a partition whose batch stalls (a slow call in
// the handler) holds only itself: the other partitions' records all
// commit meanwhile, in their own transactions, and the stalled one's
// once it is released; every row lands once, in order. Before the
// per-partition pipelines (issue 26), every poll waited for all of its
// batches, so one stalled partition stopped the runner.
func TestAStalledPartitionDoesNotHoldTheOthers(t *testing.T) {
	t.Parallel()
	const n = 4000
	b := newBed(t, 4, n)
	release := make(chan struct{})
	r := b.start(t, load(func(recs []*kgo.Record) {
		if recs[0].Partition == 0 {
			<-release
		}
	}), offsetstore.Concurrency(4), offsetstore.MaxRecordsPerCommit(100))
	perPartition := func(p int32) int {
		var rows int
		if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM results WHERE part = $1`, p).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		return rows
	}
	var want int
	for p := int32(1); p < 4; p++ {
		k, err := b.k.Admin.ListEndOffsets(context.Background(), b.topic)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := k.Lookup(b.topic, p)
		want += int(o.Offset)
	}
	waitFor(t, time.Minute, "partitions 1 to 3 to be loaded while partition 0 stalls", func() bool {
		return perPartition(1)+perPartition(2)+perPartition(3) == want
	})
	if got := perPartition(0); got != 0 {
		t.Fatalf("partition 0 has %d rows while its handler stalls", got)
	}
	close(release)
	waitFor(t, time.Minute, "every row", func() bool { return b.rows(t) == n })
	r.stop(t)
	t.Logf("verifier: %v", b.verify(t))
}
