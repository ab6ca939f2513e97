package loop

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadUserOptions refuses what the runner owns, naming what to use, keeps
// the user's partition callbacks (which, chained, run after the runner's
// own), and, given options it accepts, sends nothing to any broker while
// it looks (a refused kgo.ConsumeTopics may ask for metadata).
func TestReadUserOptions(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			dialed <- struct{}{}
			c.Close()
		}
	}()
	seeds := kgo.SeedBrokers(ln.Addr().String())
	owned := map[string]string{"ConsumerGroup": "use Group", "ConsumeTopics": "use Topics", "TransactionalID": "not here",
		"AdjustFetchOffsetsFn": "the runner positions", "ConsumeRegex": "use Topics", "ConsumePartitions": "use Group"}
	for name, opt := range map[string]kgo.Opt{
		"ConsumerGroup":   kgo.ConsumerGroup("g"),
		"ConsumeTopics":   kgo.ConsumeTopics("t"),
		"TransactionalID": kgo.TransactionalID("x"),
		"ConsumeRegex":    kgo.ConsumeRegex(),
		"AdjustFetchOffsetsFn": kgo.AdjustFetchOffsetsFn(func(_ context.Context, m map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
			return m, nil
		}),
	} {
		if _, err := ReadUserOptions(nil, []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1"), opt}, owned); err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), owned[name]) {
			t.Errorf("%s: err = %v, want one naming it and what to use", name, err)
		}
	}

	var calls []string
	hooks, err := ReadUserOptions(nil, []kgo.Opt{seeds, kgo.AllowAutoTopicCreation(), kgo.DisableIdempotentWrite(),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { calls = append(calls, "user assigned") }),
		kgo.OnPartitionsRevoked(func(context.Context, *kgo.Client, map[string][]int32) { calls = append(calls, "user revoked") }),
	}, owned)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(seeds)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	parts := map[string][]int32{"t": {0}}
	ours := func(what string) PartitionsFunc {
		return func(context.Context, *kgo.Client, map[string][]int32) { calls = append(calls, what) }
	}
	Chain(ours("assigned"), hooks.Assigned)(context.Background(), cl, parts)
	Chain(ours("revoked"), hooks.Revoked)(context.Background(), cl, parts)
	Chain(ours("lost"), hooks.Lost)(context.Background(), cl, parts)
	if got := strings.Join(calls, ", "); got != "assigned, user assigned, revoked, user revoked, lost" {
		t.Errorf("calls: %s; want the runner's, then the user's where given", got)
	}
	// Callbacks left unset chain to franz-go's stand-ins, which do
	// nothing here (auto-commit is off): the runner's alone run.
	calls = nil
	bare, err := ReadUserOptions(nil, []kgo.Opt{seeds}, owned)
	if err != nil {
		t.Fatal(err)
	}
	Chain(ours("revoked"), bare.Revoked)(context.Background(), cl, parts)
	Chain(ours("lost"), bare.Lost)(context.Background(), cl, parts)
	if got := strings.Join(calls, ", "); got != "revoked, lost" {
		t.Errorf("calls without user callbacks: %s; want the runner's alone", got)
	}
	select {
	case <-dialed:
		t.Error("looking at the options connected to the seed broker")
	case <-time.After(500 * time.Millisecond):
	}
}
