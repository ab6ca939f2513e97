package eos

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"

	"github.com/twmb/franz-go/pkg/kgo"
)

func TestDecideRecordOutcomeUnit(t *testing.T) {
	const budget = 30 * time.Second
	in := &kgo.Record{Topic: "in", Partition: 2, Offset: 7, Key: []byte("k")}
	outs := []*kgo.Record{{Topic: "out"}, {Topic: "out"}}
	boom := errors.New("boom")
	stop := eoskit.Stop()
	deadLetter := eoskit.DeadLetterTo("dlq")
	retryThenDeadLetter := eoskit.Retry(time.Millisecond, 3).Then(eoskit.DeadLetterTo("retry-dlq"))
	gaveUp := fmt.Errorf("call: %w", context.DeadlineExceeded)
	refusedConfig := fmt.Errorf("handler: %w", &eoskit.ConfigError{Package: "eos", Setting: "Concurrency"})
	stalled := fmt.Errorf("handler: %w", loop.Restart(&TableStallError{Topic: "regions"}))
	for _, c := range []struct {
		name   string
		a      attempt
		policy eoskit.ErrorPolicy
		want   recordOutcome
		// deadLetterTo is the dead letter's topic, for sendDeadLetter;
		// tooSlow, that the error is ErrHandlerTooSlow's.
		deadLetterTo string
		tooSlow      bool
	}{
		{name: "outputs", a: attempt{outs: outs}, policy: stop,
			want: recordOutcome{kind: produceOutputs, outs: outs}},
		{name: "no outputs", a: attempt{}, policy: stop,
			want: recordOutcome{kind: produceOutputs}},
		{name: "handler failed under Stop", a: attempt{err: boom}, policy: stop,
			want: recordOutcome{kind: recordFailed, err: boom}},
		{name: "handler failed under Retry", a: attempt{err: boom}, policy: retryThenDeadLetter,
			want: recordOutcome{kind: recordFailed, err: boom}},
		{name: "handler failed under DeadLetter", a: attempt{err: boom}, policy: deadLetter,
			want: recordOutcome{kind: sendDeadLetter, err: boom}, deadLetterTo: "dlq"},
		{name: "handler refused the configuration under DeadLetter: no record's fault", a: attempt{err: refusedConfig}, policy: deadLetter,
			want: recordOutcome{kind: recordFailed, err: refusedConfig}},
		{name: "handler asked for a new session under DeadLetter: no record's fault", a: attempt{err: stalled}, policy: deadLetter,
			want: recordOutcome{kind: recordFailed, err: stalled}},
		{name: "poisoned as a Retry's fallback", a: attempt{poisoned: true, err: boom}, policy: retryThenDeadLetter,
			want: recordOutcome{kind: sendDeadLetter, err: boom}, deadLetterTo: "retry-dlq"},
		{name: "shut down while the handler failed", a: attempt{shutdown: true, err: boom}, policy: deadLetter,
			want: recordOutcome{kind: shutDown}},
		{name: "budget gone before the handler started", a: attempt{outOfBudget: true, others: 6}, policy: stop,
			want: recordOutcome{kind: outOfBudget, next: 3}},
		{name: "budget gone before the handler started, one other", a: attempt{outOfBudget: true, others: 1}, policy: stop,
			want: recordOutcome{kind: outOfBudget, next: 1}},
		{name: "gave up among others, quickly", a: attempt{outOfBudget: true, err: gaveUp, others: 5, took: budget / 4}, policy: stop,
			want: recordOutcome{kind: outOfBudget, next: 2}},
		{name: "gave up among others, having taken most of the budget: it leads the next", a: attempt{outOfBudget: true, err: gaveUp, others: 5, took: budget}, policy: stop,
			want: recordOutcome{kind: outOfBudget, next: 5}},
		{name: "gave up alone once: not blamed", a: attempt{outOfBudget: true, err: gaveUp, slowAlone: 1, took: budget}, policy: stop,
			want: recordOutcome{kind: outOfBudget, next: 1}},
		{name: "gave up alone twice under Stop: blamed", a: attempt{outOfBudget: true, err: gaveUp, slowAlone: 2, took: budget}, policy: stop,
			want: recordOutcome{kind: recordFailed}, tooSlow: true},
		{name: "gave up alone twice under DeadLetter: poisoned for the next transaction", a: attempt{outOfBudget: true, err: gaveUp, slowAlone: 2, took: budget}, policy: deadLetter,
			want: recordOutcome{kind: outOfBudget, next: 1}, tooSlow: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.a.in = in
			got := decide(c.a, c.policy, budget)
			if got.kind != c.want.kind || got.next != c.want.next {
				t.Fatalf("decide = kind %d, next %d; want kind %d, next %d", got.kind, got.next, c.want.kind, c.want.next)
			}
			switch {
			case c.tooSlow:
				if !errors.Is(got.err, ErrHandlerTooSlow) || errors.Is(got.err, context.DeadlineExceeded) {
					t.Errorf("err = %v, want ErrHandlerTooSlow, not a deadline", got.err)
				}
			case got.err != c.want.err:
				t.Errorf("err = %v, want %v", got.err, c.want.err)
			}
			if c.deadLetterTo != "" {
				if len(got.outs) != 1 || got.outs[0].Topic != c.deadLetterTo || string(got.outs[0].Key) != "k" {
					t.Fatalf("outs = %v, want one dead letter to %s with the input's key", got.outs, c.deadLetterTo)
				}
				return
			}
			if len(got.outs) != len(c.want.outs) {
				t.Errorf("outs = %v, want %v", got.outs, c.want.outs)
			}
			if got.goesOn() != (c.want.kind == produceOutputs || c.want.kind == sendDeadLetter) {
				t.Errorf("goesOn = %v for kind %d", got.goesOn(), got.kind)
			}
		})
	}
}

func TestBatchAppliesARecordOutcomeUnit(t *testing.T) {
	at, other := coords{"in", 0, 5}, coords{"in", 0, 6}
	boom, slow := errors.New("boom"), fmt.Errorf("%w: slow", ErrHandlerTooSlow)
	f := newFailures()
	b := &batch{}
	if b.apply(at, recordOutcome{kind: produceOutputs, outs: make([]*kgo.Record, 2)}, f); b.out != 2 {
		t.Fatalf("outputs: 2 outputs to count, counted %d", b.out)
	}
	if b.apply(other, recordOutcome{kind: sendDeadLetter, outs: make([]*kgo.Record, 1), err: boom}, f); b.out != 3 || b.deadLetters[other] != boom {
		t.Fatalf("dead letter: out %d, dead letters %v", b.out, b.deadLetters)
	}
	if b.apply(at, recordOutcome{kind: recordFailed, err: boom}, f); b.failed != boom || b.failedAt != at {
		t.Fatalf("failure: failed %v at %v", b.failed, b.failedAt)
	}
	if b.apply(other, recordOutcome{kind: recordFailed, err: slow}, f); b.failed != boom || b.failedAt != at {
		t.Fatalf("a second failure must not replace the first: failed %v at %v", b.failed, b.failedAt)
	}
	if b.apply(at, recordOutcome{kind: outOfBudget, next: 1, err: slow}, f); !b.overBudget || b.next != 1 {
		t.Fatalf("out of budget: overBudget %v, next %d", b.overBudget, b.next)
	}
	if cause, ok := f.poisonedBy(at); !ok || cause != slow {
		t.Fatalf("out of budget with an error must poison the input: %v, %v", cause, ok)
	}
	if b.apply(at, recordOutcome{kind: shutDown}, f); !b.shutdown {
		t.Fatal("shutdown not noted")
	}
}

func TestFailuresBlameAnInputTooSlowTwiceAloneUnit(t *testing.T) {
	at := coords{"in", 1, 9}
	f := newFailures()
	for i, want := range []int{1, 2, 1} { // blamed at 2, then counted afresh
		if got := f.ranOutAlone(at); got != want {
			t.Fatalf("call %d: ranOutAlone = %d, want %d", i+1, got, want)
		}
	}
	f.committed(&batch{first: at})
	if got := f.ranOutAlone(at); got != 1 {
		t.Fatalf("after its commit: ranOutAlone = %d, want 1", got)
	}
}

// A dead letter carries eoskit's own dead-letter headers only: those the
// input's producer put on it go, so that no replay reads the producer's
// eoskit-source-topic (issue 47 item 8; kept on 3bfa998).
func TestADeadLetterDropsTheInputsOwnDeadLetterHeaders(t *testing.T) {
	in := &kgo.Record{Topic: "reports", Partition: 2, Offset: 41, Headers: []kgo.RecordHeader{
		{Key: "region", Value: []byte("north")},
		{Key: "eoskit-source-topic", Value: []byte("payments")},
		{Key: "eoskit-outbox-value", Value: []byte("blocked")},
	}}
	out := deadLetter("dlq", in, errors.New("bad"))
	got := map[string][]string{}
	for _, h := range out.Headers {
		got[h.Key] = append(got[h.Key], string(h.Value))
	}
	if fmt.Sprint(got["eoskit-source-topic"]) != "[reports]" || got["eoskit-outbox-value"] != nil || fmt.Sprint(got["region"]) != "[north]" {
		t.Fatalf("dead letter headers %v: want eoskit-source-topic [reports] alone, no eoskit-outbox-value, the input's region kept", got)
	}
}
