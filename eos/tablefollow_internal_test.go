package eos

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/state"
)

// A table partition whose records known to be committed are not fetched
// within the table's timeout stalls prepare with a *TableStallError asking
// for a new session, within that timeout, not a handler's budget; a
// handler meeting a partition prepare did not ready asks for one too,
// never blaming its record.
func TestATableThatCannotBeFetchedStallsBeforeTheHandlers(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "regions"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	f, err := newTableFollower([]kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, NewTable("regions", TableRestoreTimeout(time.Second)), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()

	// The empty topic is caught up at once.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.prepare(ctx, 0, 0, time.Now()); err != nil {
		t.Fatalf("prepare of an empty table: %v", err)
	}
	// Records said committed up to offset 100 that never come.
	f.mu.Lock()
	f.parts[0].end = 100
	f.mu.Unlock()
	start := time.Now()
	err = f.prepare(ctx, 0, 0, time.Now())
	var stall *TableStallError
	if !errors.As(err, new(*loop.RestartError)) || !errors.As(err, &stall) || stall.Partition != 0 || stall.End != 100 {
		t.Fatalf("prepare with records never fetched: %v, want a RestartError of a TableStallError", err)
	}
	if took := time.Since(start); took < time.Second || took > 10*time.Second {
		t.Fatalf("the stall came after %s, want the table's timeout, 1 s", took)
	}

	// A position past the topic's end (the topic created again) is a
	// configuration error, at once.
	if err := f.prepare(ctx, 1, 50, time.Now()); !errors.Is(err, eoskit.ErrInvalidConfig) {
		t.Fatalf("prepare at a position past the table's end: %v, want a ConfigError", err)
	}

	// A partition no prepare readied: the handler's advance asks for a
	// new session.
	kv := state.NewTxn(state.NewMemory(), 0).Scope()
	if err := f.advance(kv, 3, time.Now()); !errors.As(err, new(*loop.RestartError)) {
		t.Fatalf("advance of a partition never prepared: %v, want a RestartError", err)
	}
}
