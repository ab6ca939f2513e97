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

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/outboxrelay"
	"github.com/eoskit/eoskit/testsupport/httpcheck"
)

// The program is production-shaped (issue 47 item 7; on 7d16fbd it had no
// -http): it answers the probes and serves its metrics while it relays.
func TestTheProgramServesItsProbesAndMetrics(t *testing.T) {
	k := integration.Kafka(t)
	out, positions := k.NewTopic(1), k.NewTopic(1)
	pool, url := integration.PostgresWithURL(t)
	ctx := context.Background()
	cfg := outboxrelay.Config{Brokers: k.Brokers, PositionTopic: positions, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	addr := httpcheck.FreeAddr(t)
	if err := migrateOnce(ctx, url, cfg); err != nil {
		t.Fatal(err)
	}
	// The database is dropped when the test ends: its slot first, once
	// the relay has stopped (cleanups run last first).
	t.Cleanup(func() {
		if slot, err := outbox.DefaultSlot(ctx, pool); err == nil {
			_ = outbox.DropSlot(ctx, pool, slot)
		}
	})
	stop := httpcheck.Background(t, func(ctx context.Context) error { return run(ctx, url, addr, cfg) })

	integration.WaitFor(t, time.Minute, "/readyz answering 200", func() (bool, error) {
		code, _ := httpcheck.Get("http://" + addr + "/readyz")
		return code == http.StatusOK, nil
	})
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outboxrelay.Submit(ctx, tx, out, dashboard.Report{ID: "r1", Region: "north", Cases: 3})
	}); err != nil {
		t.Fatal(err)
	}
	integration.WaitFor(t, time.Minute, "the report published", func() (bool, error) {
		return len(k.ReadNow(out, kgo.ReadCommitted(), 5*time.Second)) == 1, nil
	})
	if code, body := httpcheck.Get("http://" + addr + "/healthz"); code != http.StatusOK || !strings.Contains(body, `"path":"outbox"`) {
		t.Errorf("/healthz: %d %s", code, body)
	}
	integration.WaitFor(t, time.Minute, "/metrics counting the relay's commit", func() (bool, error) {
		code, body := httpcheck.Get("http://" + addr + "/metrics")
		return code == http.StatusOK && strings.Contains(body, `eoskit_processor_transactions_total{outcome="committed",path="outbox"`) &&
			strings.Contains(body, "go_goroutines"), nil
	})
	stop()
	if code, _ := httpcheck.Get("http://" + addr + "/healthz"); code != 0 {
		t.Errorf("/healthz answers %d after the program stopped", code)
	}
}

// A start never creates the slot: one dropped while the relay was down
// stops it with outbox.ErrNoSlot, instead of being made anew past the
// records the old one held (issue 47's review; before, the program ran
// Migrate at every start, which re-created it and went on).
func TestAStartDoesNotMakeADroppedSlotAnew(t *testing.T) {
	k := integration.Kafka(t)
	pool, url := integration.PostgresWithURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := outboxrelay.Config{Brokers: k.Brokers, PositionTopic: k.NewTopic(1), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if err := migrateOnce(ctx, url, cfg); err != nil {
		t.Fatal(err)
	}
	slot, err := outbox.DefaultSlot(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.DropSlot(ctx, pool, slot); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, url, "", cfg); !errors.Is(err, outbox.ErrNoSlot) {
		t.Fatalf("run without the slot returned %v, want outbox.ErrNoSlot", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d slots named %s after the start (%v), want none", n, slot, err)
	}
}
