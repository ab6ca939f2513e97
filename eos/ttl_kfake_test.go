package eos_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/window"
)

// ttlRun is what runTTL leaves: each key's last update ("nil" for a
// tombstone), and the keys the store holds as it stopped, with their
// values.
type ttlRun struct {
	updates map[string]string
	store   map[string]string
}

// runTTL counts the reports given (key, time) on brokers' "reports" topic
// (one partition; earlier runs' reports before them, their state in the
// changelog) under TTL(ttl), until each is committed.
func runTTL(t *testing.T, brokers []string, ttl time.Duration, reports []report) ttlRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seed := reportsClient(t, brokers)
	for _, r := range reports {
		if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte(r.key), Timestamp: r.at}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(seed)
	ends, err := adm.ListEndOffsets(ctx, "reports")
	if err != nil {
		t.Fatal(err)
	}
	end, _ := ends.Lookup("reports", 0)
	txnID, _ := eos.StableTransactionalID("ttl", "0")
	p, err := eos.NewProcessor(eos.Count(), eos.Brokers(brokers...), eos.Group("ttl"), eos.Topics("reports"), eos.TransactionalID(txnID),
		eos.CommitInterval(20*time.Millisecond), eos.Logger(slog.New(slog.DiscardHandler)),
		eos.Changelog("ttl-changelog", eos.CreateChangelog(), eos.EmitUpdates("updates"), eos.TTL(ttl)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	for {
		offsets, err := adm.FetchOffsets(ctx, "ttl")
		if o, ok := offsets.Lookup("reports", 0); err == nil && ok && o.At == end.Offset {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the processor did not commit the reports up to offset %d", end.Offset)
		}
		time.Sleep(10 * time.Millisecond)
	}
	out := ttlRun{updates: map[string]string{}, store: map[string]string{}}
	_ = p.State().Range(func(_ int32, key, value []byte) bool {
		out.store[string(key)] = string(value)
		return true
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, r := range readCommitted(t, brokers, "updates") {
		v := string(r.Value)
		if r.Value == nil {
			v = "nil"
		}
		out.updates[string(r.Key)] = v
	}
	return out
}

// Keys expire a TTL of stream time after their last write: a key written
// again before that keeps counting; one that went idle counts from
// nothing when it comes back (even before a sweep deleted it), and one
// that stays away is deleted (a tombstone) at the next sweep. A report
// out of order moves no stream time. The second run restarts on the same
// changelog: the stamps and stream time restore with the state, so
// what expired stays expired, and what did not goes on counting.
func TestKeysExpireAfterTheirTTLOfStreamTime(t *testing.T) {
	brokers := windowCluster(t)
	first := runTTL(t, brokers, time.Minute, []report{
		{"a", at("0s")}, {"b", at("10s")}, {"c", at("20s")},
		{"a", at("50s")},   // a renewed: lives to 1m50s
		{"b", at("5s")},    // out of order: b renewed at stream time 50s
		{"c", at("1m25s")}, // c idle since 20s: expired at 1m20s, counts from nothing
	})
	want := map[string]string{"a": "2", "b": "2", "c": "1"}
	if !maps.Equal(first.updates, want) || !maps.Equal(first.store, want) {
		t.Fatalf("after the first run: updates %v, store %v; want %v", first.updates, first.store, want)
	}
	second := runTTL(t, brokers, time.Minute, []report{
		{"d", at("1m40s")}, // a sweep point: nothing expired (b at 50s lives to 1m50s)
		{"b", at("1m45s")}, // b renewed
		{"e", at("2m30s")}, // a sweep: a (50s) expired at 1m50s, deleted; c (1m25s) lives to 2m25s: deleted too
	})
	want = map[string]string{"a": "nil", "b": "3", "c": "nil", "d": "1", "e": "1"}
	if !maps.Equal(second.updates, want) {
		t.Fatalf("after the second run: updates %v; want %v", second.updates, want)
	}
	if want := map[string]string{"b": "3", "d": "1", "e": "1"}; !maps.Equal(second.store, want) {
		t.Fatalf("the store holds %v; want %v", second.store, want)
	}
}

// TTL's settings are checked: a duration that is not whole milliseconds,
// none, or under KeyOrder lanes, from NewProcessor; a windowed
// aggregation under TTL, from Run at its first record.
func TestTTLIsChecked(t *testing.T) {
	base := []eos.ProcessorOption{eos.Brokers("127.0.0.1:1"), eos.Group("g"), eos.Topics("in"), eos.TransactionalID("t")}
	for name, opts := range map[string][]eos.ProcessorOption{
		"zero":     {eos.Changelog("cl", eos.TTL(0))},
		"fraction": {eos.Changelog("cl", eos.TTL(1500*time.Microsecond))},
		"KeyOrder": {eos.Changelog("cl", eos.TTL(time.Minute)), eos.Concurrency(4, eos.KeyOrder)},
	} {
		_, err := eos.NewProcessor(eos.Count(), append(base, opts...)...)
		var ce *eoskit.ConfigError
		if !errors.As(err, &ce) || ce.Setting != "TTL" {
			t.Errorf("%s: %v; want a *eoskit.ConfigError naming TTL", name, err)
		}
	}

	brokers := windowCluster(t)
	seed := reportsClient(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte("a"), Timestamp: day0}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	h, err := eos.WindowedCount(window.Tumbling(time.Minute, 0))
	if err != nil {
		t.Fatal(err)
	}
	p, err := eos.NewProcessor(h, eos.Brokers(brokers...), eos.Group("g"), eos.Topics("reports"), eos.TransactionalID("t"),
		eos.Logger(slog.New(slog.DiscardHandler)), eos.Changelog("windows-changelog", eos.CreateChangelog(), eos.TTL(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	var ce *eoskit.ConfigError
	if err := p.Run(ctx); !errors.As(err, &ce) || ce.Setting != "TTL" {
		t.Fatalf("Run: %v; want a *eoskit.ConfigError naming TTL", err)
	}
}
