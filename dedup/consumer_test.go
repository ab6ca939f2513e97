package dedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/testbed"
	"github.com/eoskit/eoskit/verify"
)

// bed is one test's topic, database, store and side-effect table. The side
// effect is an insert into effects, which has no unique constraint, plus an
// increment of a running total: a duplicate shows in both.
type bed struct {
	k     *integration.KafkaCluster
	pool  *pgxpool.Pool
	store *dedup.PostgresStore
	topic string
	dbURL string // the test database's URL, for pools of the test's own
}

func newBed(t *testing.T, partitions int32) *bed {
	t.Helper()
	return newBedOn(t, integration.Kafka(t), partitions)
}

func newBedOn(t *testing.T, k *integration.KafkaCluster, partitions int32) *bed {
	t.Helper()
	b := &bed{k: k}
	b.pool, b.dbURL = integration.PostgresWithURL(t)
	b.topic = b.k.NewTopic(partitions)
	var err error
	if b.store, err = dedup.NewPostgresStore(""); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.store.Migrate(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE effects (id text NOT NULL, consumer text NOT NULL);
		CREATE TABLE totals (name text PRIMARY KEY, n bigint NOT NULL); INSERT INTO totals VALUES ('all', 0)`); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bed) handler(name string) dedup.Handler {
	return func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		id, _ := dedup.HeaderID(dedup.IDHeader)(r)
		if id == "" {
			id = string(r.Value)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO effects (id, consumer) VALUES ($1, $2)`, id, name); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE totals SET n = n + 1 WHERE name = 'all'`)
		return err
	}
}

// produce writes the records with a plain, non-idempotent producer, as an
// at-least-once pipeline's producer would.
func (b *bed) produce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	cl := b.k.Client(kgo.DefaultProduceTopic(b.topic), kgo.DisableIdempotentWrite())
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// stamped returns n stamped messages, each with its value as a readable id.
func stamped(n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = dedup.Stamp(&kgo.Record{Key: fmt.Appendf(nil, "k%d", i%13), Value: fmt.Appendf(nil, "m%d", i)})
	}
	return recs
}

// copies returns fresh records carrying the same ids and payloads, as a
// producer retry after a lost acknowledgement sends them.
func copies(recs []*kgo.Record) []*kgo.Record {
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		out[i] = &kgo.Record{Key: r.Key, Value: r.Value, Headers: append([]kgo.RecordHeader(nil), r.Headers...)}
	}
	return out
}

type run struct {
	c      *dedup.Consumer
	cancel context.CancelFunc
	done   chan error
}

func (b *bed) start(t *testing.T, name string, opts ...dedup.Option) *run {
	t.Helper()
	opts = append([]dedup.Option{dedup.Brokers(b.k.Brokers...), dedup.Topics(b.topic), dedup.Scope("effects"),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))}, opts...)
	c, err := dedup.NewConsumer(b.pool, b.store, b.handler(name), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(cancel)
	return r
}

func (r *run) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Run returned %v, want nil after cancel", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("consumer did not stop")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// assertOnce checks that each of the n messages' effects is in the table
// exactly once and the total counts n.
func (b *bed) assertOnce(t *testing.T, n int) {
	t.Helper()
	var rows, distinct, total int
	err := b.pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM effects), (SELECT count(DISTINCT id) FROM effects), (SELECT n FROM totals)`).Scan(&rows, &distinct, &total)
	if err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n || total != n {
		t.Fatalf("effects: %d rows, %d distinct ids, total %d; want %d of each", rows, distinct, total, n)
	}
}

func (b *bed) effects(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Copies really in the topic (a retried non-idempotent send, the same
// message sent twice) are skipped; then the group's Kafka offsets are set
// back to the start, which is what a crash between the database commit and
// the offset commit, or a replay, leaves behind: every redelivery is
// skipped too.
func TestDuplicatesInTheTopicAndRedeliveriesApplyOnce(t *testing.T) {
	t.Parallel()
	b := newBed(t, 3)
	msgs := stamped(1000)
	b.produce(t, msgs...)
	b.produce(t, copies(msgs[200:500])...) // a retry after a lost acknowledgement
	b.produce(t, copies(msgs[7:8])...)     // sent twice more
	b.produce(t, copies(msgs[7:8])...)
	const inTopic = 1000 + 300 + 2

	group := integration.UniqueName(t, "g")
	r := b.start(t, "a", dedup.Group(group))
	waitFor(t, "every record to be consumed", func() bool {
		s := r.c.Stats()
		return s.Applied+s.Skipped >= inTopic
	})
	r.stop(t)
	b.assertOnce(t, 1000)
	if s := r.c.Stats(); s.Applied != 1000 || s.Skipped != inTopic-1000 {
		t.Fatalf("stats %+v, want 1000 applied and %d skipped", s, inTopic-1000)
	}

	// Kafka's offsets behind the database: everything comes again.
	adm := b.k.Admin
	offsets := kadm.Offsets{}
	for p := range int32(3) {
		offsets.Add(kadm.Offset{Topic: b.topic, Partition: p, At: 0})
	}
	if _, err := adm.CommitOffsets(context.Background(), group, offsets); err != nil {
		t.Fatal(err)
	}
	again := b.start(t, "a", dedup.Group(group))
	waitFor(t, "the redelivery to be consumed", func() bool { return again.c.Stats().Skipped >= inTopic })
	again.stop(t)
	if s := again.c.Stats(); s.Applied != 0 {
		t.Fatalf("redelivery applied %d records, want 0", s.Applied)
	}
	b.assertOnce(t, 1000)
}

// Two consumers in different groups read the same messages at the same
// time and race to claim each id in one scope: each effect lands once.
func TestRacingConsumersApplyEachMessageOnce(t *testing.T) {
	t.Parallel()
	b := newBed(t, 4)
	const n = 5000
	r1 := b.start(t, "one", dedup.Group(integration.UniqueName(t, "g1")), dedup.MaxRecordsPerCommit(50))
	r2 := b.start(t, "two", dedup.Group(integration.UniqueName(t, "g2")), dedup.MaxRecordsPerCommit(50))
	// Both must be polling before the messages exist, or the first to join
	// can apply all of them before the second races it.
	waitFor(t, "both consumers to be assigned all 4 partitions", func() bool {
		return len(r1.c.Health().Assigned[b.topic]) == 4 && len(r2.c.Health().Assigned[b.topic]) == 4
	})
	b.produce(t, stamped(n)...)
	waitFor(t, "both consumers to read everything", func() bool {
		s1, s2 := r1.c.Stats(), r2.c.Stats()
		return s1.Applied+s1.Skipped >= n && s2.Applied+s2.Skipped >= n
	})
	r1.stop(t)
	r2.stop(t)
	b.assertOnce(t, n)
	s1, s2 := r1.c.Stats(), r2.c.Stats()
	if s1.Applied+s2.Applied != n || s1.Applied == 0 || s2.Applied == 0 {
		t.Fatalf("applied %d + %d, want %d split between two racing consumers", s1.Applied, s2.Applied, n)
	}
	t.Logf("consumer one applied %d and skipped %d; consumer two applied %d and skipped %d", s1.Applied, s1.Skipped, s2.Applied, s2.Skipped)
}

func TestMissingIDPolicies(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	msgs := stamped(10)
	bare := &kgo.Record{Value: []byte("no-id")}
	b.produce(t, append(msgs[:5:5], append([]*kgo.Record{bare}, msgs[5:]...)...)...)

	r := b.start(t, "a", dedup.Group(integration.UniqueName(t, "g")))
	var err error
	select {
	case err = <-r.done:
	case <-time.After(time.Minute):
		t.Fatal("consumer did not stop on a record without an id")
	}
	var rerr *eoskit.RecordError
	if !errors.Is(err, dedup.ErrMissingID) || !errors.As(err, &rerr) || rerr.Topic != b.topic || rerr.Offset != 5 {
		t.Fatalf("Run = %v, want ErrMissingID naming %s[0]@5", err, b.topic)
	}
	if n := b.effects(t); n > 5 {
		t.Fatalf("%d effects applied; the record without id (offset 5) or those after it leaked", n)
	}

	unique := b.start(t, "a", dedup.Group(integration.UniqueName(t, "g")), dedup.OnMissingID(dedup.TreatAsUnique))
	waitFor(t, "all 11 records to be consumed", func() bool { return unique.c.Stats().Applied+unique.c.Stats().Skipped >= 11 })
	unique.stop(t)
	var bareEffects int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE id = 'no-id'`).Scan(&bareEffects); err != nil {
		t.Fatal(err)
	}
	if bareEffects != 1 {
		t.Fatalf("the record without id was applied %d times, want 1 under TreatAsUnique", bareEffects)
	}
}

// A handler failure rolls back the claims with the effects, so a retry
// applies the batch once.
func TestHandlerErrorRollsBackTheClaim(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	b.produce(t, stamped(100)...)
	failures := 0
	h := b.handler("a")
	c, err := dedup.NewConsumer(b.pool, b.store, func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if string(r.Value) == "m50" && failures < 2 {
			failures++
			return errors.New("dependency down")
		}
		return h(ctx, tx, r)
	}, dedup.Brokers(b.k.Brokers...), dedup.Topics(b.topic), dedup.Group(integration.UniqueName(t, "g")),
		dedup.OnHandlerError(eoskit.Retry(10*time.Millisecond, 0)), dedup.MaxRecordsPerCommit(1000),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, "all records applied", func() bool { return c.Stats().Applied >= 100 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if failures != 2 {
		t.Fatalf("handler failed %d times, want 2", failures)
	}
	b.assertOnce(t, 100)
}

// Retry with a number of attempts, then a fallback, on input from a
// transactional producer that also aborts, over three partitions: a record
// that keeps failing is tried that many times, then parked in
// eoskit_dead_letters with its id claimed (a copy sent later is skipped),
// or stops the consumer naming it and its attempts; a record that fails
// fewer times takes effect once.
func TestRetryThenFallback(t *testing.T) {
	t.Parallel()
	for _, fallback := range []string{"dead letter", "stop"} {
		t.Run(fallback, func(t *testing.T) {
			t.Parallel()
			b := newBed(t, 3)
			ctx := context.Background()
			committed, aborted, err := integration.SeedTransactional(ctx, b.k.Brokers, b.topic, 600, 50, nil)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			runs := map[string]int{}
			effect := b.handler("a")
			h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
				id := string(r.Key)
				mu.Lock()
				runs[id]++
				n := runs[id]
				mu.Unlock()
				switch {
				case strings.HasSuffix(id, "77"):
					return errors.New("poison " + id)
				case strings.HasSuffix(id, "5") && n <= 2:
					return errors.New("flaky " + id)
				}
				return effect(ctx, tx, r)
			}
			policy := eoskit.Retry(time.Millisecond, 3).Then(dedup.DeadLetter())
			if fallback == "stop" {
				policy = eoskit.Retry(time.Millisecond, 3)
			}
			c, err := dedup.NewConsumer(b.pool, b.store, h, dedup.Brokers(b.k.Brokers...), dedup.Topics(b.topic),
				dedup.Group(integration.UniqueName(t, "g")), dedup.ID(dedup.KeyID()), dedup.OnHandlerError(policy),
				dedup.MaxRecordsPerCommit(100), dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
			if err != nil {
				t.Fatal(err)
			}
			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()

			if fallback == "stop" {
				select {
				case err := <-done:
					var rerr *eoskit.RecordError
					if !errors.As(err, &rerr) || rerr.Attempts != 3 || !strings.HasSuffix(rerr.Err.Error(), "77") {
						t.Fatalf("Run = %v, want a *RecordError for a record ending in 77 after 3 attempts", err)
					}
				case <-time.After(2 * time.Minute):
					t.Fatal("the consumer did not stop on a record that always fails")
				}
				return
			}

			var good, bad []string
			for _, id := range committed {
				if strings.HasSuffix(id, "77") {
					bad = append(bad, id)
				} else {
					good = append(good, id)
				}
			}
			waitFor(t, "the good records to take effect and the bad to be parked", func() bool {
				select {
				case err := <-done:
					t.Fatalf("Run returned %v before every record took effect or was parked", err)
				default:
				}
				return b.effects(t) >= len(good) && c.Stats().DeadLetters >= int64(len(bad))
			})
			// Copies of the parked records, sent again: their ids are
			// claimed, so they are skipped, not parked or applied.
			var again []*kgo.Record
			for _, id := range bad {
				again = append(again, &kgo.Record{Key: []byte(id), Value: []byte(id)})
			}
			b.produce(t, again...)
			waitFor(t, "the copies to be skipped", func() bool { return c.Stats().Skipped >= int64(len(bad)) })
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}

			rows, err := b.pool.Query(ctx, `SELECT id FROM effects`)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			outs := make([]verify.Output, len(ids))
			for i, id := range ids {
				outs[i] = verify.Output{ID: id, Position: verify.Position{Topic: "effects", Offset: int64(i)}}
			}
			if err := verify.Check(verify.Run{Input: good, Output: outs, AbortedInput: aborted}).Err(); err != nil {
				t.Fatal(err)
			}
			rows, err = b.pool.Query(ctx, `SELECT key FROM eoskit_dead_letters WHERE error LIKE 'poison %'`)
			if err != nil {
				t.Fatal(err)
			}
			keys, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
			if err != nil {
				t.Fatal(err)
			}
			parked := map[string]int{}
			for _, k := range keys {
				parked[string(k)]++
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range bad {
				if parked[id] != 1 || runs[id] != 3 {
					t.Errorf("%s: parked %d times after %d runs, want once after 3 (the Retry's attempts)", id, parked[id], runs[id])
				}
			}
			if len(keys) != len(bad) || c.Stats().DeadLetters != int64(len(bad)) {
				t.Errorf("%d dead letters (Stats %d), want the %d records that always fail", len(keys), c.Stats().DeadLetters, len(bad))
			}
		})
	}
}

// Partitions are applied at once, a database transaction each, on input
// from a transactional producer that also aborts, over six partitions;
// then a copy of every tenth message is sent again, to another partition:
// every committed message takes effect once, nothing aborted does, the
// copies are skipped, and batches did run at once, never more than the
// bound. (Copies sent with the originals make batches of different
// partitions wait on each other's claims, which is correct but runs them
// one after the other.)
func TestConcurrentPartitionsApplyOnce(t *testing.T) {
	t.Parallel()
	b := newBed(t, 6)
	ctx := context.Background()
	committed, aborted, err := integration.SeedTransactional(ctx, b.k.Brokers, b.topic, 6000, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := b.k.Client(kgo.DefaultProduceTopic(b.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var again []*kgo.Record
	for i := 0; i < len(committed); i += 10 {
		again = append(again, &kgo.Record{Key: []byte(committed[i]), Value: []byte(committed[i]), Partition: int32(i/10) % 6})
	}
	var now, most atomic.Int64
	effect := b.handler("a")
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		n := now.Add(1)
		defer now.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(200 * time.Microsecond)
		return effect(ctx, tx, r)
	}
	c, err := dedup.NewConsumer(b.pool, b.store, h, dedup.Brokers(b.k.Brokers...), dedup.Topics(b.topic),
		dedup.Group(integration.UniqueName(t, "g")), dedup.ID(dedup.KeyID()), dedup.Concurrency(3),
		// Polls large enough to span partitions: franz-go fills a poll
		// partition by partition, and each partition holds ~1,000.
		dedup.MaxRecordsPerCommit(5000),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	waitFor(t, "every message", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned %v before every message took effect", err)
		default:
		}
		return c.Stats().Applied >= int64(len(committed))
	})
	if err := cl.ProduceSync(ctx, again...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every message and every copy", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned %v before every message took effect", err)
		default:
		}
		st := c.Stats()
		return st.Applied+st.Skipped >= int64(len(committed)+len(again))
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(ctx, `SELECT id FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	outs := make([]verify.Output, len(ids))
	for i, id := range ids {
		outs[i] = verify.Output{ID: id, Position: verify.Position{Topic: "effects", Offset: int64(i)}}
	}
	rep := verify.Check(verify.Run{Input: committed, Output: outs, AbortedInput: aborted})
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Skipped < int64(len(again)) {
		t.Errorf("skipped %d copies, want at least the %d sent again", st.Skipped, len(again))
	}
	if m := most.Load(); m < 2 || m > 3 {
		t.Errorf("handlers at once: at most %d; want above 1 and at most the bound, 3", m)
	}
	t.Logf("verifier: %v; handlers at once: %d", rep, most.Load())
}

// Purge removes expired ids in small batches while a consumer keeps
// claiming; live ids stay and the consumer is not held up.
func TestPurgeRemovesExpiredIDsWhileConsuming(t *testing.T) {
	t.Parallel()
	b := newBed(t, 2)
	ctx := context.Background()
	// 20,000 ids processed two days ago, 1,000 processed now.
	if _, err := b.pool.Exec(ctx, `INSERT INTO eoskit_processed_ids (scope, id, processed_at)
		SELECT 'effects', convert_to('old-' || g, 'UTF8'), now() - interval '2 days' FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO eoskit_processed_ids (scope, id)
		SELECT 'effects', convert_to('live-' || g, 'UTF8') FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	b.produce(t, stamped(n)...)
	r := b.start(t, "a", dedup.Group(integration.UniqueName(t, "g")), dedup.MaxRecordsPerCommit(100))

	purged, err := b.store.Purge(ctx, b.pool, time.Now().Add(-24*time.Hour), 500)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the consumer to apply everything during and after the purge", func() bool { return r.c.Stats().Applied >= n })
	r.stop(t)

	var old, live int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE convert_from(id, 'UTF8') LIKE 'old-%'), count(*) FILTER (WHERE convert_from(id, 'UTF8') LIKE 'live-%') FROM eoskit_processed_ids`).Scan(&old, &live); err != nil {
		t.Fatal(err)
	}
	if purged != 20000 || old != 0 || live != 1000 {
		t.Fatalf("purged %d; %d expired and %d live ids remain; want 20000 purged, 0 and 1000", purged, old, live)
	}
	b.assertOnce(t, n)
}

// The input is written by a transactional producer upstream that aborts
// every other transaction, over three partitions: only the committed
// messages may take effect. Before the consumer read with read_committed,
// every aborted message was applied.
func TestAbortedInputsAreNeverApplied(t *testing.T) {
	t.Parallel()
	b := newBed(t, 3)
	ctx := context.Background()
	committed, aborted, err := integration.SeedTransactional(ctx, b.k.Brokers, b.topic, 3000, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := b.start(t, "a", dedup.Group(integration.UniqueName(t, "g")), dedup.ID(dedup.KeyID()))
	// Aborted transactions sit between committed ones in every partition:
	// once the last committed message took effect, a consumer that
	// applies aborted ones has applied all but the last few.
	waitFor(t, "every committed message to take effect", func() bool { return b.effects(t) >= len(committed) })
	time.Sleep(2 * time.Second) // and the aborted transactions after the last committed ones
	r.stop(t)
	rows, err := b.pool.Query(ctx, `SELECT id FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	var outs []verify.Output
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		outs = append(outs, verify.Output{ID: id, Position: verify.Position{Topic: "effects", Offset: int64(len(outs))}})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rep := verify.Check(verify.Run{Input: committed, Output: outs, AbortedInput: aborted})
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d committed and %d aborted inputs; verifier: %v", len(committed), len(aborted), rep)
}

func TestNewConsumerRejectsBadConfig(t *testing.T) {
	store, _ := dedup.NewPostgresStore("")
	pool := &pgxpool.Pool{} // never used: construction fails first
	h := func(context.Context, pgx.Tx, *kgo.Record) error { return nil }
	base := []dedup.Option{dedup.Brokers("127.0.0.1:1"), dedup.Group("g"), dedup.Topics("t")}
	tests := map[string][]dedup.Option{
		"no brokers":                   {dedup.Group("g"), dedup.Topics("t")},
		"no group":                     {dedup.Brokers("b:1"), dedup.Topics("t")},
		"no topics":                    {dedup.Brokers("b:1"), dedup.Group("g")},
		"zero poll":                    append(base, dedup.MaxRecordsPerCommit(0)),
		"nil id func":                  append(base, dedup.ID(nil)),
		"unknown policy":               append(base, dedup.OnMissingID(9)),
		"negative backoff":             append(base, dedup.OnHandlerError(eoskit.Retry(-1, 3))),
		"negative attempts":            append(base, dedup.OnHandlerError(eoskit.Retry(time.Millisecond, -1))),
		"endless retry with fallback":  append(base, dedup.OnHandlerError(eoskit.Retry(time.Millisecond, 0).Then(dedup.DeadLetter()))),
		"fallback that retries":        append(base, dedup.OnHandlerError(eoskit.Retry(time.Millisecond, 2).Then(eoskit.Retry(time.Millisecond, 2)))),
		"direct partitions in a group": append(base, dedup.ClientOptions(kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"t": {0: kgo.NewOffset()}}))),
		"read uncommitted":             append(base, dedup.ClientOptions(kgo.FetchIsolationLevel(kgo.ReadUncommitted()))),
		"group through ClientOptions":  append(base, dedup.ClientOptions(kgo.ConsumerGroup("other"))),
		"topics through ClientOptions": append(base, dedup.ClientOptions(kgo.ConsumeTopics("other"))),
		"zero concurrency":             append(base, dedup.Concurrency(0)),
		"a dead letter to a topic":     append(base, dedup.OnHandlerError(eoskit.Retry(time.Millisecond, 2).Then(eoskit.DeadLetterTo("orders-dlq")))),
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := dedup.NewConsumer(pool, store, h, opts...)
			// One type for every runner's refusal: *eoskit.ConfigError.
			var cerr *eoskit.ConfigError
			if !errors.Is(err, eoskit.ErrInvalidConfig) || !errors.As(err, &cerr) || cerr.Setting == "" {
				t.Fatalf("NewConsumer = %v, want a *ConfigError naming the setting", err)
			}
			if strings.Contains(name, "dead letter") && cerr.Setting != "OnHandlerError" {
				t.Fatalf("NewConsumer = %v, want OnHandlerError named", err)
			}
		})
	}
	if _, err := dedup.NewPostgresStore("bad;name"); !errors.Is(err, eoskit.ErrInvalidConfig) {
		t.Fatalf("NewPostgresStore(bad) = %v, want ErrInvalidConfig", err)
	}
	// The control: base alone, and a dead letter to the table, are taken.
	if _, err := dedup.NewConsumer(pool, store, h, append(base, dedup.OnHandlerError(eoskit.Retry(time.Millisecond, 2).Then(dedup.DeadLetter())))...); err != nil {
		t.Fatalf("NewConsumer with a table dead letter = %v, want nil", err)
	}
}

// The broker is killed with SIGKILL while a batch is in its handler, and
// started again on the same data. The batch commits in PostgreSQL while the
// broker is down, so its offset commit fails, and the consumer loses its
// partitions with it (its group session ends); the broker starts again only
// once both happened, and 35 s after the kill at the soonest (the fault
// model's long outage). The group then resumes from the offsets committed
// before the kill: every record applied while the broker was down is
// delivered again, and must be skipped by its claim, each message applied
// once. Before, the test killed the broker at whatever point the run had
// reached and only logged the skips: a kill between batches, with nothing
// buffered, redelivered nothing and tested nothing.
func TestBrokerHardRestartAppliesEachMessageOnce(t *testing.T) {
	t.Parallel()
	broker := testbed.StartLocalBroker(t)
	b := newBedOn(t, broker.KafkaCluster, 3)
	const n = 10_000
	b.produce(t, stamped(n)...)
	slow := b.handler("a")
	// hold stops the first handler call after it is set until release
	// is closed, with its batch's transaction open.
	var hold atomic.Bool
	var once sync.Once
	held, release := make(chan struct{}), make(chan struct{})
	logs := &logWatch{}
	c, err := dedup.NewConsumer(b.pool, b.store, func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if hold.Load() {
			once.Do(func() {
				close(held)
				<-release
			})
		}
		time.Sleep(200 * time.Microsecond)
		return slow(ctx, tx, r)
	}, dedup.Brokers(b.k.Brokers...), dedup.Topics(b.topic), dedup.Group(integration.UniqueName(t, "g")), dedup.MaxRecordsPerCommit(100),
		dedup.Logger(slog.New(slog.NewTextHandler(logs, nil))),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, "30% applied", func() bool { return c.Stats().Applied >= n*3/10 })
	hold.Store(true)
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("Run returned %v before a batch was held", err)
	case <-time.After(time.Minute):
		t.Fatal("no batch reached the handler to be held")
	}
	atKill := c.Stats().Applied
	if atKill >= n {
		t.Fatal("the run had finished before the broker was killed")
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer rcancel()
	if err := broker.Kill(rctx); err != nil {
		t.Fatalf("kill: %v (broker log: %s)", err, broker.Log())
	}
	killed := time.Now()
	failedBefore := logs.count("offset commit failed")
	close(release)
	waitFor(t, "the held batch's offset commit to fail and the consumer to lose its partitions", func() bool {
		return logs.count("offset commit failed") > failedBefore && len(c.Health().Assigned[b.topic]) == 0
	})
	appliedDown := c.Stats().Applied - atKill // committed in PostgreSQL, not in Kafka
	if appliedDown < 1 {
		t.Fatalf("%d records applied while the broker was down; the held batch did not commit", appliedDown)
	}
	// Down as long as the fault model's long outage, whatever the wait
	// above took.
	time.Sleep(testbed.LongOutage - time.Since(killed))
	if err := broker.Start(rctx); err != nil {
		t.Fatalf("start: %v (broker log: %s)", err, broker.Log())
	}
	waitFor(t, "every message applied", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Run returned %v before every message was applied", err)
		default:
		}
		return c.Stats().Applied >= n
	})
	waitFor(t, "the redelivery of what was applied while the broker was down", func() bool { return c.Stats().Skipped >= appliedDown })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b.assertOnce(t, n)
	if s := c.Stats(); s.Applied != n || s.Skipped < appliedDown {
		t.Fatalf("stats %+v; want %d applied, and at least the %d applied while the broker was down skipped on redelivery", s, n, appliedDown)
	}
	t.Logf("broker killed with %d of %d applied; %d applied while it was down; stats after: %+v", atKill, n, appliedDown, c.Stats())
}

// logWatch is a log destination that counts what it was given, and
// passes it on to stderr.
type logWatch struct {
	mu   sync.Mutex
	text strings.Builder
}

func (w *logWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.text.Write(p)
	w.mu.Unlock()
	return os.Stderr.Write(p)
}

// count returns how many times s was logged so far.
func (w *logWatch) count(s string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Count(w.text.String(), s)
}

// Ids are bytes, not text: schema-registry keys start with 0x00, and keys
// or headers need not be UTF-8. Messages keyed by such ids (each sent
// twice) take effect once each; an id longer than MaxIDLength stops Run
// with a *eoskit.RecordError naming its record and wrapping ErrIDTooLong, before
// anything of its batch is applied (as a missing id does).
// Before, ids were text: every claim of a binary id failed, was retried as
// a database error, and Run returned an error naming no record.
func TestBinaryAndOversizeIDs(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	var msgs []*kgo.Record
	for i := range 50 {
		key := []byte{0x00, 0x00, 0x00, 0x00, byte(i), 0xff, 0xfe, byte(i * 7)} // a schema-registry-style key, not UTF-8
		msgs = append(msgs, &kgo.Record{Key: key, Value: fmt.Appendf(nil, "b%d", i)})
	}
	b.produce(t, msgs...)
	b.produce(t, copies(msgs)...)
	group := integration.UniqueName(t, "g")
	r := b.start(t, "a", dedup.Group(group), dedup.ID(dedup.KeyID()))
	waitFor(t, "every binary id to be consumed", func() bool {
		s := r.c.Stats()
		return s.Applied+s.Skipped >= 100
	})
	r.stop(t)
	b.assertOnce(t, 50)

	long := &kgo.Record{Key: bytes.Repeat([]byte{0x01}, dedup.MaxIDLength+1), Value: []byte("too-long")}
	b.produce(t, &kgo.Record{Key: []byte("fine-1"), Value: []byte("fine-1")}, long, &kgo.Record{Key: []byte("fine-2"), Value: []byte("fine-2")})
	again := b.start(t, "a", dedup.Group(group), dedup.ID(dedup.KeyID()))
	var err error
	select {
	case err = <-again.done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not stop on an id over MaxIDLength")
	}
	var rerr *eoskit.RecordError
	if !errors.As(err, &rerr) || !errors.Is(err, dedup.ErrIDTooLong) || rerr.Topic != b.topic || rerr.Offset != 101 {
		t.Fatalf("Run returned %v; want a *RecordError for %s[0]@101 wrapping ErrIDTooLong", err, b.topic)
	}
	b.assertOnce(t, 50) // nothing of the long id's batch
	t.Logf("Run: %v", err)
}

// A table made by an earlier eoskit holds ids as text: Migrate turns the
// column into bytea with each id's UTF-8 bytes, so ids claimed before the
// upgrade stay claimed.
func TestMigrateTurnsTextIDsIntoBytes(t *testing.T) {
	t.Parallel()
	pool := integration.Postgres(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE old_ids (scope text NOT NULL, id text NOT NULL,
		processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (scope, id));
		INSERT INTO old_ids (scope, id) VALUES ('s', 'payment-1'), ('s', 'zahlung-ü')`); err != nil {
		t.Fatal(err)
	}
	store, err := dedup.NewPostgresStore("old_ids")
	if err != nil {
		t.Fatal(err)
	}
	// Before Migrate, a consumer refuses the table: every claim would fail.
	c, err := dedup.NewConsumer(pool, store, func(context.Context, pgx.Tx, *kgo.Record) error { return nil },
		dedup.Brokers("127.0.0.1:1"), dedup.Group("g"), dedup.Topics("t"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx); !errors.Is(err, eoskit.ErrInvalidConfig) {
		t.Fatalf("Run on an unmigrated table returned %v; want ErrInvalidConfig", err)
	}
	for range 2 { // idempotent
		if err := store.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		claimed, err := store.ClaimBatch(ctx, tx, "s", []string{"payment-1", "zahlung-ü", "payment-2"})
		if err != nil {
			return err
		}
		if len(claimed) != 1 || !claimed["payment-2"] {
			t.Errorf("claimed %v after the upgrade; want only payment-2", claimed)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A handler that panics on one message: its batch rolls back (the claims
// with it) and Run returns a *eoskit.RecordError naming the record; a consumer
// with a fixed handler then applies every message once. Before, the panic
// ended the process.
func TestHandlerPanicStopsRunNamingTheRecord(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	msgs := stamped(200)
	b.produce(t, msgs...)
	group := integration.UniqueName(t, "g")
	opts := []dedup.Option{dedup.Brokers(b.k.Brokers...), dedup.Topics(b.topic), dedup.Scope("effects"), dedup.Group(group),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))}
	handler := b.handler("a")
	c, err := dedup.NewConsumer(b.pool, b.store, func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if string(r.Value) == "m77" {
			panic("cannot parse m77")
		}
		return handler(ctx, tx, r)
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not stop on a panicking handler")
	}
	var rerr *eoskit.RecordError
	if !errors.As(err, &rerr) || rerr.Offset != 77 || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("Run returned %v; want a *RecordError for offset 77 saying the handler panicked", err)
	}
	fixed := b.start(t, "a", dedup.Group(group))
	waitFor(t, "every message to take effect", func() bool { return b.effects(t) >= 200 })
	fixed.stop(t)
	b.assertOnce(t, 200)
	t.Logf("Run: %v", err)
}

// poolWith returns a pool on the bed's database with the given URL
// parameters (pool_max_conns=1, say), closed when the test ends.
func (b *bed) poolWith(t *testing.T, params string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), b.dbURL+"&"+params)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// runConsumer runs a consumer of the bed's topic on pool with handler h,
// until the test ends.
func (b *bed) runConsumer(t *testing.T, pool *pgxpool.Pool, h dedup.Handler, opts ...dedup.Option) *run {
	t.Helper()
	opts = append([]dedup.Option{dedup.Brokers(b.k.Brokers...), dedup.Topics(b.topic), dedup.Group(integration.UniqueName(t, "g")),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))}, opts...)
	c, err := dedup.NewConsumer(pool, b.store, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(cancel)
	return r
}

// running fails the test if Run has returned.
func (r *run) running(t *testing.T) {
	t.Helper()
	select {
	case err := <-r.done:
		t.Fatalf("Run returned %v; want it still running", err)
	default:
	}
}

// A handler's lock wait that times out (55P03, under a lock_timeout the
// application's pool sets) is the database pushing back, like a deadlock
// or a serialization failure: the batch is retried, and the record
// applied once the lock is free, never dead-lettered. Before, 55P03 was
// taken for the handler's own failure, and DeadLetter parked a valid
// record whose effect was never applied.
func TestHandlerLockTimeoutIsRetriedNotDeadLettered(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	ctx := context.Background()
	b.produce(t, stamped(1)...)
	locker, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(ctx)
	if _, err := locker.Exec(ctx, `SELECT n FROM totals WHERE name = 'all' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var lockWaits atomic.Int64
	effect := b.handler("a")
	r := b.runConsumer(t, b.poolWith(t, "lock_timeout=1000"), func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		err := effect(ctx, tx, rec)
		if err != nil && strings.Contains(err.Error(), "55P03") {
			lockWaits.Add(1)
		}
		return err
	}, dedup.OnHandlerError(dedup.DeadLetter()))
	waitFor(t, "a lock wait to time out in the handler", func() bool { r.running(t); return lockWaits.Load() >= 1 })
	time.Sleep(2 * time.Second)
	if err := locker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the record to be applied or parked", func() bool {
		r.running(t)
		s := r.c.Stats()
		return s.Applied+s.DeadLetters >= 1
	})
	if s := r.c.Stats(); s.Applied != 1 || s.DeadLetters != 0 {
		t.Fatalf("stats %+v after %d lock timeouts; want the record applied, none parked", s, lockWaits.Load())
	}
	r.stop(t)
	b.assertOnce(t, 1)
}

// With the pool as small as the documentation allows (one connection for
// Concurrency(1)), a handler's plain error is the record's, decided
// without a second connection: DeadLetter parks the record within seconds
// and the others are applied once. Before, the consumer pinged the pool
// from inside the batch's transaction to tell an outage from a handler
// error; the ping waited for a second connection, timed out, and the
// error was retried as a database outage until Run returned "batch failed
// 10 times".
func TestHandlerErrorWithAPoolOfOneIsTheRecords(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	b.produce(t, stamped(5)...)
	var firstRefusal atomic.Int64 // unix nanos
	effect := b.handler("a")
	r := b.runConsumer(t, b.poolWith(t, "pool_max_conns=1"), func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if string(rec.Value) == "m2" {
			firstRefusal.CompareAndSwap(0, time.Now().UnixNano())
			return errors.New("rejected m2")
		}
		return effect(ctx, tx, rec)
	}, dedup.Concurrency(1), dedup.OnHandlerError(dedup.DeadLetter()))
	waitFor(t, "the handler to refuse m2", func() bool { r.running(t); return firstRefusal.Load() != 0 })
	deadline := time.Unix(0, firstRefusal.Load()).Add(15 * time.Second)
	for r.c.Stats().DeadLetters < 1 {
		r.running(t)
		if time.Now().After(deadline) {
			t.Fatalf("m2 not parked 15 s after its handler refused it (stats %+v)", r.c.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(t, "the other records", func() bool { r.running(t); return r.c.Stats().Applied >= 4 })
	r.stop(t)
	b.assertOnce(t, 4)
	var parked int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM eoskit_dead_letters WHERE value = 'm2' AND error = 'rejected m2'`).Scan(&parked); err != nil {
		t.Fatal(err)
	}
	if parked != 1 {
		t.Fatalf("%d dead letters for m2, want 1", parked)
	}
}

// A handler's error whose text PostgreSQL refuses as text (a NUL byte,
// bytes that are not UTF-8) is parked under DeadLetter like any other, its
// text made valid (a NUL, and each run of bytes that are not UTF-8, as
// U+FFFD), and the consumer goes on. Before, the dead letter's INSERT
// failed (SQLSTATE 22021) at every attempt, and Run returned "batch failed
// 10 times".
func TestDeadLetterWithAnErrorTextPostgreSQLRefuses(t *testing.T) {
	t.Parallel()
	b := newBed(t, 1)
	msgs := stamped(5)
	binaryKey := []byte{0x00, 0xff, 0xfe, 'k', 0x00} // stored as bytes, as it came
	msgs[3].Key = binaryKey
	b.produce(t, msgs...)
	effect := b.handler("a")
	r := b.runConsumer(t, b.pool, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if string(rec.Value) == "m3" {
			return errors.New("refused\x00 m3 \xff\xfe end")
		}
		return effect(ctx, tx, rec)
	}, dedup.OnHandlerError(dedup.DeadLetter()))
	waitFor(t, "the good records and the dead letter", func() bool {
		r.running(t)
		s := r.c.Stats()
		return s.Applied >= 4 && s.DeadLetters >= 1
	})
	// The consumer goes on: a record sent after the dead letter is applied.
	b.produce(t, dedup.Stamp(&kgo.Record{Value: []byte("after")}))
	waitFor(t, "the record after the dead letter", func() bool { r.running(t); return r.c.Stats().Applied >= 5 })
	r.stop(t)
	b.assertOnce(t, 5)
	var text string
	var key []byte
	if err := b.pool.QueryRow(context.Background(), `SELECT error, key FROM eoskit_dead_letters WHERE value = 'm3'`).Scan(&text, &key); err != nil {
		t.Fatal(err)
	}
	if want := "refused\uFFFD m3 \uFFFD end"; text != want || !bytes.Equal(key, binaryKey) {
		t.Fatalf("the dead letter reads error %q, key %q; want %q, %q", text, key, want, binaryKey)
	}
}
