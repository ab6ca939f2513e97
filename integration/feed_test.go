package integration_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/offsetstore"
)

// A user's test of their own program with the kit: a feed that counts
// reports per region into a totals table (an offsetstore.Runner), killed
// with SIGKILL mid-run and started again, must leave every total exact.

// TestMain lets StartChild run the feed in a process of its own.
func TestMain(m *testing.M) {
	integration.RunChild(map[string]integration.ChildFunc{"feed": feed})
	os.Exit(m.Run())
}

// feed is the program under test, as it runs in production. args: the
// brokers, the database's URL, the group, the topic.
func feed(ctx context.Context, args []string) error {
	pool, err := pgxpool.New(ctx, args[1])
	if err != nil {
		return err
	}
	defer pool.Close()
	count := func(ctx context.Context, tx pgx.Tx, reports []*kgo.Record) error {
		for _, r := range reports {
			if _, err := tx.Exec(ctx, `INSERT INTO totals VALUES ($1, 1)
				ON CONFLICT (region) DO UPDATE SET reports = totals.reports + 1`, string(r.Key)); err != nil {
				return err
			}
		}
		time.Sleep(20 * time.Millisecond) // a handler with work to do: the kill lands mid-run
		return nil
	}
	r, err := offsetstore.NewRunner(pool, count, offsetstore.Brokers(strings.Split(args[0], ",")...),
		offsetstore.Group(args[2]), offsetstore.Topics(args[3]), offsetstore.MaxRecordsPerCommit(100),
		offsetstore.MirrorToKafka(), // the stored offsets copied to the group, for WaitCaughtUp
		// A killed instance's partitions move on within seconds.
		offsetstore.ClientOptions(kgo.SessionTimeout(6*time.Second), kgo.RebalanceTimeout(5*time.Second)))
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

func TestFeedTotalsAreExactAfterASIGKILL(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	pool, dbURL := integration.PostgresWithURL(t)
	if err := offsetstore.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE totals (region text PRIMARY KEY, reports bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	topic, group := k.NewTopic(3), integration.UniqueName(t, "feed")
	const n = 6000
	want := map[string]int64{}
	var reports []*kgo.Record
	for i := range n {
		region := []string{"north", "south", "east"}[i%3]
		want[region]++
		reports = append(reports, &kgo.Record{Key: []byte(region), Value: fmt.Appendf(nil, "report %d", i)})
	}
	k.Produce(topic, reports...)
	args := []string{strings.Join(k.Brokers, ","), dbURL, group, topic}

	counted := func(ctx context.Context) (n int64, err error) {
		err = pool.QueryRow(ctx, `SELECT coalesce(sum(reports), 0) FROM totals`).Scan(&n)
		return n, err
	}
	first := integration.StartChild(t, "feed", args...)
	integration.WaitForCtx(t, time.Minute, "the feed to count 1000 reports", func(ctx context.Context) (bool, error) {
		c, err := counted(ctx)
		return c >= 1000, err
	})
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	if c, err := counted(t.Context()); err != nil || c >= n {
		t.Fatalf("killed with %d of %d reports counted (%v): not mid-run", c, n, err)
	}
	second := integration.StartChild(t, "feed", args...)
	k.WaitCaughtUp(group, topic, time.Minute)
	if err := second.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	integration.VerifyTotals(t, pool, `SELECT region, reports FROM totals`, want)
}
