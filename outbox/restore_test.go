package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// A database restored from a backup taken before the relay's last
// publish brings its slot and the slot's token back, while Kafka's
// position is past the restored log. Once new writes carry the log past
// that position, the relay must not take the new transactions for the
// ones Kafka holds: it refuses with ErrRewound, naming both positions,
// until an operator decides; told where the restored log begins
// (ResumeAfter), it publishes everything written since, once. Before, it
// skipped every new transaction that ended below the position: lost for
// good (issue 43 item 17, failing on a0c3743).
func TestARestoredDatabaseIsNotTakenForTheOneKafkaHolds(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	pg := testbed.StartPrivatePostgres(t)
	b := newBedOn(t, k, pg.Pool(t), pg.URL)
	ctx := context.Background()
	write := func(pool *pgxpool.Pool, prefix string, txns, per int) []string {
		var values []string
		for i := range txns {
			recs := make([]*kgo.Record, per)
			for j := range recs {
				v := fmt.Sprintf("%s-%d-%d", prefix, i, j)
				values = append(values, v)
				recs[j] = &kgo.Record{Topic: b.out, Key: []byte(v), Value: []byte(v)}
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, recs...) }); err != nil {
				t.Fatal(err)
			}
		}
		return values
	}
	published := func(prefix string) int {
		n := 0
		for _, r := range k.ReadNow(b.out, kgo.ReadCommitted(), time.Minute) {
			if strings.HasPrefix(string(r.Value), prefix+"-") {
				n++
			}
		}
		return n
	}
	publish := func(pool *pgxpool.Pool, prefix string, want int) {
		run := b.startOn(t, pool)
		waitFor(t, time.Minute, "the "+prefix+" records published", func() bool { return published(prefix) >= want })
		if err := run.stop(); err != nil {
			t.Fatal(err)
		}
	}

	publish(b.pool, "a", len(write(b.pool, "a", 1, 10)))
	if err := pg.Snapshot(ctx, "backup"); err != nil {
		t.Fatal(err)
	}
	pool := pg.Pool(t)
	publish(pool, "b", len(write(pool, "b", 20, 50)))
	if err := pg.Restore(ctx, "backup"); err != nil {
		t.Fatal(err)
	}
	pool = pg.Pool(t)
	// Where the restored log ends, as the documentation tells the
	// operator to read it before new writes: its last checkpoint.
	var restorePoint string
	if err := pool.QueryRow(ctx, `SELECT checkpoint_lsn::text FROM pg_control_checkpoint()`).Scan(&restorePoint); err != nil {
		t.Fatal(err)
	}
	c := write(pool, "c", 60, 50) // three times b's log: past Kafka's position
	run := b.startOn(t, pool)
	var refused error
	select {
	case refused = <-run.done:
		run.done <- refused
	case <-time.After(time.Minute):
		t.Fatalf("the relay runs on with %d of the %d records written after the restore published, and no refusal", published("c"), len(c))
	}
	if !errors.Is(refused, outbox.ErrRewound) {
		t.Fatalf("Run returned %v, want ErrRewound", refused)
	}
	t.Logf("refused: %v", refused)
	if n := published("c"); n != 0 {
		t.Fatalf("%d records written after the restore published before the refusal", n)
	}

	// The operator's decision: the log past the restore point is new.
	r, err := outbox.NewRelay(pool, b.opts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ResumeAfter(ctx, restorePoint); err != nil {
		t.Fatal(err)
	}
	publish(pool, "c", len(c))
	seen := map[string]int{}
	for _, rec := range k.ReadAll(b.out, kgo.ReadCommitted(), time.Minute) {
		seen[string(rec.Value)]++
	}
	for v, n := range seen {
		if n != 1 {
			t.Errorf("%s published %d times", v, n)
		}
	}
	for _, v := range c {
		if seen[v] != 1 {
			t.Fatalf("%s, written after the restore, published %d times", v, seen[v])
		}
	}
}
