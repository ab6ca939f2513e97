package eos_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

var errParse = errors.New("cannot parse the record")

type timeoutError struct{ op string }

func (e *timeoutError) Error() string { return e.op + ": timed out" }

// A classified policy on the real broker: a record that cannot be parsed
// goes to the dead-letter topic at once (its handler runs once, even when
// another record aborts its transaction), one that times out twice is
// retried and then copied, and a record failing otherwise stops Run
// naming it. Run again with that record mended, every input is copied
// once, in order, or dead-lettered once.
func TestProcessorClassifiedPolicy(t *testing.T) {
	t.Parallel()
	const n, stopAt = 300, 290
	k := integration.Kafka(t)
	in, out, dlt := k.NewTopic(1), k.NewTopic(1), k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	inputs := k.Seed(in, n)
	index := map[string]int{}
	for i, id := range inputs {
		index[id] = i
	}
	var mu sync.Mutex
	calls := map[string]int{}
	mended := false
	var stopOffset int64 = -1
	h := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		id := string(r.Key)
		mu.Lock()
		calls[id]++
		c, fixed := calls[id], mended
		mu.Unlock()
		switch i := index[id]; {
		case i == stopAt && !fixed:
			stopOffset = r.Offset
			return nil, errors.New("the disk is full")
		case i%50 == 13:
			return nil, fmt.Errorf("record %s: %w", id, errParse)
		case i%50 == 27 && c <= 2:
			return nil, fmt.Errorf("calling the pricing service: %w", &timeoutError{op: "price " + id})
		}
		return copyHandler(out)(ctx, r)
	}
	policy := eoskit.Classify(eoskit.Stop(),
		eoskit.When(errParse, eos.DeadLetter(dlt)),
		eoskit.WhenAs[*timeoutError](eoskit.Retry(time.Millisecond, 5)),
	)
	p, err := eos.NewProcessor(h, append(processorOpts(k, group, in, "0"), eos.Logger(testLogger(t)),
		eos.ClientOptions(testClientOpts()...), eos.OnHandlerError(policy), eos.MaxRecordsPerCommit(50))...)
	if err != nil {
		t.Fatal(err)
	}
	runFor := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return p.Run(ctx)
	}
	start := time.Now()
	err = runFor(time.Minute)
	t.Logf("Run returned after %s: %v", time.Since(start).Round(time.Millisecond), err)
	var rerr *eoskit.RecordError
	if !errors.As(err, &rerr) || rerr.Offset != stopOffset || rerr.Attempts != 1 || rerr.Err.Error() != "the disk is full" {
		t.Fatalf("Run = %v; want a *RecordError at offset %d after 1 attempt", err, stopOffset)
	}

	mu.Lock()
	mended = true
	mu.Unlock()
	var good, parsed []string
	for i, id := range inputs {
		if i%50 == 13 {
			parsed = append(parsed, id)
		} else {
			good = append(good, id)
		}
	}
	progress := followCommitted(t, k, out)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	waitFor(t, time.Minute, "every good input copied", func() bool { return progress.n.Load() >= int64(len(good)) })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the mended Run returned %v", err)
	}
	k.VerifyTopic(good, out, verifyTimeout)
	var dead []string
	for _, r := range k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout) {
		dead = append(dead, string(r.Key))
	}
	if fmt.Sprint(dead) != fmt.Sprint(parsed) {
		t.Errorf("dead-lettered %v; want the records that cannot be parsed, once each, %v", dead, parsed)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range parsed {
		if calls[id] != 1 {
			t.Errorf("%s (cannot be parsed): its handler ran %d times; want once, no retry", id, calls[id])
		}
	}
}
