package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/kafkatopostgres"
	"github.com/eoskit/eoskit/testsupport/httpcheck"
)

// The program is production-shaped (issue 47 item 7; on 7d16fbd it had no
// -http, -instance or -dead-letters): it answers the probes and serves its
// metrics, and with -dead-letters a report that does not parse is parked
// in the database while the reports around it count; without it (the
// negative control) the same report stops the program, naming it.
func TestTheProgramServesItsProbesAndParksABadReport(t *testing.T) {
	k := integration.Kafka(t)
	topic := k.NewTopic(2)
	bad := &kgo.Record{Topic: topic, Value: []byte("not a report")}
	k.Produce(topic,
		dashboard.Report{ID: "r1", Region: "north", Cases: 3}.Record(topic),
		bad,
		dashboard.Report{ID: "r2", Region: "north", Cases: 4}.Record(topic))

	t.Run("without -dead-letters the bad report stops it", func(t *testing.T) {
		_, url := integration.PostgresWithURL(t)
		cfg := config(t, k.Brokers, topic)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := migrateOnce(ctx, url, cfg); err != nil {
			t.Fatal(err)
		}
		err := run(ctx, url, "", cfg)
		var rerr *eoskit.RecordError
		if !errors.As(err, &rerr) || !strings.Contains(err.Error(), `"not a report"`) {
			t.Fatalf("run returned %v, want a *eoskit.RecordError for the bad report", err)
		}
	})

	t.Run("with -dead-letters it goes on, and answers the probes", func(t *testing.T) {
		pool, url := integration.PostgresWithURL(t)
		cfg := config(t, k.Brokers, topic)
		cfg.DeadLetters = true
		cfg.Instance = "kafkatopostgres-0"
		addr := httpcheck.FreeAddr(t)
		if err := migrateOnce(context.Background(), url, cfg); err != nil {
			t.Fatal(err)
		}
		defer httpcheck.Background(t, func(ctx context.Context) error { return run(ctx, url, addr, cfg) })()

		integration.WaitFor(t, 2*time.Minute, "the two reports counted and the bad one parked", func() (bool, error) {
			totals, err := dashboard.Totals(context.Background(), pool, dashboard.DefaultTables)
			var parked int
			if err == nil {
				err = pool.QueryRow(context.Background(), `SELECT count(*) FROM eoskit_dead_letters WHERE value = $1`, bad.Value).Scan(&parked)
			}
			return err == nil && totals["north"] == 7 && parked == 1, nil
		})
		integration.WaitFor(t, time.Minute, "/readyz answering 200", func() (bool, error) {
			code, _ := httpcheck.Get("http://" + addr + "/readyz")
			return code == http.StatusOK, nil
		})
		if code, body := httpcheck.Get("http://" + addr + "/healthz"); code != http.StatusOK || !strings.Contains(body, `"path":"offsetstore"`) {
			t.Errorf("/healthz: %d %s", code, body)
		}
		if code, body := httpcheck.Get("http://" + addr + "/metrics"); code != http.StatusOK ||
			!strings.Contains(body, `eoskit_processor_transactions_total{outcome="committed",path="offsetstore"`) ||
			!strings.Contains(body, `eoskit_processor_dead_letters_total{path="offsetstore"} 1`) ||
			!strings.Contains(body, "go_goroutines") {
			t.Errorf("/metrics: %d, without the runner's and the runtime's series:\n%s", code, body)
		}
	})
}

func config(t *testing.T, brokers []string, topic string) kafkatopostgres.Config {
	return kafkatopostgres.Config{Brokers: brokers, Group: integration.UniqueName(t, "group"), Topic: topic,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}
