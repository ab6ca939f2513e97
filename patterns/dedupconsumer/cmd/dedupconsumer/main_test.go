package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/dedupconsumer"
	"github.com/eoskit/eoskit/testsupport/httpcheck"
)

// The program is production-shaped (issue 47 item 7; on 7d16fbd it had no
// -http, -instance, -dead-letters or -retention, and its id table grew for
// ever): it answers the probes and serves its metrics, parks a report
// that does not parse with -dead-letters, and purges the ids older than
// -retention at its start, keeping the newer ones.
func TestTheProgramServesItsProbesParksABadReportAndPurgesOldIDs(t *testing.T) {
	k := integration.Kafka(t)
	topic := k.NewTopic(2)
	bad := dedup.Stamp(&kgo.Record{Topic: topic, Value: []byte("not a report")})
	k.Produce(topic,
		dedup.Stamp(dashboard.Report{ID: "r1", Region: "north", Cases: 3}.Record(topic)),
		bad,
		dedup.Stamp(dashboard.Report{ID: "r2", Region: "north", Cases: 4}.Record(topic)))
	pool, url := integration.PostgresWithURL(t)
	cfg := dedupconsumer.Config{Brokers: k.Brokers, Group: integration.UniqueName(t, "group"), Topic: topic,
		Instance: "dedupconsumer-0", DeadLetters: true, Retention: 48 * time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx := context.Background()
	cfg.Pool = pool
	if err := dedupconsumer.Migrate(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Ids claimed three days ago and one day ago, by an earlier run.
	if _, err := pool.Exec(ctx, `INSERT INTO dashboard_ids (scope, id, processed_at) VALUES
		('old', 'a', now() - interval '3 days'), ('old', 'b', now() - interval '3 days'), ('recent', 'c', now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	cfg.Pool = nil

	addr := httpcheck.FreeAddr(t)
	defer httpcheck.Background(t, func(ctx context.Context) error { return run(ctx, url, addr, cfg) })()

	integration.WaitFor(t, 2*time.Minute, "the two reports counted and the bad one parked", func() (bool, error) {
		totals, err := dashboard.Totals(ctx, pool, dashboard.DefaultTables)
		var parked int
		if err == nil {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM eoskit_dead_letters WHERE value = $1`, bad.Value).Scan(&parked)
		}
		return err == nil && totals["north"] == 7 && parked == 1, nil
	})
	integration.WaitFor(t, time.Minute, "the ids older than -retention purged", func() (bool, error) {
		var scopes []string
		rows, err := pool.Query(ctx, `SELECT DISTINCT scope FROM dashboard_ids WHERE scope IN ('old', 'recent')`)
		if err == nil {
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					return false, err
				}
				scopes = append(scopes, s)
			}
			err = rows.Err()
		}
		return err == nil && len(scopes) == 1 && scopes[0] == "recent", err
	})
	integration.WaitFor(t, time.Minute, "/readyz answering 200", func() (bool, error) {
		code, _ := httpcheck.Get("http://" + addr + "/readyz")
		return code == http.StatusOK, nil
	})
	if code, body := httpcheck.Get("http://" + addr + "/metrics"); code != http.StatusOK ||
		!strings.Contains(body, `eoskit_processor_transactions_total{outcome="committed",path="dedup"`) ||
		!strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics: %d, without the runner's and the runtime's series:\n%s", code, body)
	}
}
