package eos

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"
)

// What becomes of one input record in a batch is decided in one place:
// the runner notes what happened to it (an attempt), decide makes that an
// outcome, and the batch applies the outcome under its mutex (batch.apply),
// since lanes handle records at once.

// outcomeKind is what a batch does with one input record.
type outcomeKind int8

const (
	// produceOutputs: the handler returned outputs (maybe none); they are
	// produced and the batch goes on.
	produceOutputs outcomeKind = iota
	// sendDeadLetter: the input goes to the dead-letter topic, its
	// handler having failed under DeadLetter (or the input being
	// poisoned); the batch goes on.
	sendDeadLetter
	// recordFailed: the handler failed under Stop or Retry (or was too
	// slow, twice alone): the batch ends without committing, and the
	// error policy applies to the input once it has (afterFailure).
	recordFailed
	// shutDown: Run's ctx ended (past the drain): the batch ends without
	// committing, and nothing is blamed.
	shutDown
	// outOfBudget: the transaction's budget ran out before the batch's
	// records were all handled: the batch ends without committing, and
	// the next transaction takes fewer records.
	outOfBudget
)

// recordOutcome is what decide makes of an attempt.
type recordOutcome struct {
	kind outcomeKind
	// outs are the records to produce: the handler's outputs, or the
	// dead letter.
	outs []*kgo.Record
	// err is why: the dead letter's cause, or the failure the policy
	// takes. For outOfBudget, a non-nil err poisons the input with it:
	// the next transaction dead-letters it first.
	err error
	// next is, for outOfBudget, how many records the next transaction
	// takes.
	next int
}

// goesOn reports whether the batch handles further records after o.
func (o recordOutcome) goesOn() bool { return o.kind == produceOutputs || o.kind == sendDeadLetter }

// attempt is what happened to one input record: what decide needs to know.
type attempt struct {
	in *kgo.Record
	// poisoned is set when the input was dead-lettered without running
	// its handler; err is then why (see failures.poison).
	poisoned bool
	// outs and err are what the handler returned; took is how long it
	// took when it failed (0 when it succeeded: see HandleTimed).
	outs []*kgo.Record
	err  error
	took time.Duration
	// shutdown is set when Run's ctx ended (past the drain) before the
	// handler could start, or while it ran.
	shutdown bool
	// outOfBudget is set when the transaction's budget ran out: before
	// the handler could start (the batch already holding records), or
	// while it ran, the handler giving up with the budget's error.
	outOfBudget bool
	// others is how many other records the batch holds that may have
	// held this one up: every one, handled one at a time; under lanes,
	// those its lane handled before it.
	others int
	// slowAlone is, for a handler that ran out of the budget with no
	// other record in the batch, how many transactions this input has
	// done so in, this one included (see failures.ranOutAlone).
	slowAlone int
}

// decide makes the outcome of a, given the error policy and the
// transaction's budget.
func decide(a attempt, policy eoskit.ErrorPolicy, budget time.Duration) recordOutcome {
	switch {
	case a.shutdown:
		// Whatever failed, failed for that, not for its own sake.
		return recordOutcome{kind: shutDown}
	case a.outOfBudget && a.others > 0:
		// Not the input's fault, as far as anyone can tell: the batch
		// ends, and its records are read again, fewer at a time. When
		// the handler took most of the budget, as many as were before
		// it, so that it leads the transaction after; else half of
		// them.
		next := max(1, a.others/2)
		if a.took > budget/2 {
			next = a.others
		}
		return recordOutcome{kind: outOfBudget, next: next}
	case a.outOfBudget && a.slowAlone < slowAloneToBlame:
		// Alone in its transaction, but once could be a passing outage
		// or pause: it goes alone in the next one.
		return recordOutcome{kind: outOfBudget, next: 1}
	case a.outOfBudget:
		// The handler's error is only the budget's end: kept as text,
		// so that the record's error does not read as a deadline.
		err := fmt.Errorf("%w: no result within %s, the transaction's budget, twice alone in its transaction (%v)", ErrHandlerTooSlow, budget, a.err)
		if policy.For(err).Kind() == eoskit.PolicyDeadLetter {
			// This transaction has no time left: the dead letter goes
			// first in the next one.
			return recordOutcome{kind: outOfBudget, next: 1, err: err}
		}
		return recordOutcome{kind: recordFailed, err: err}
	case a.err == nil:
		return recordOutcome{kind: produceOutputs, outs: a.outs}
	case notTheRecords(a.err):
		// Whatever the policy: afterFailure ends Run, or the session.
		return recordOutcome{kind: recordFailed, err: a.err}
	}
	pol := policy.For(a.err)
	if !a.poisoned && pol.Kind() != eoskit.PolicyDeadLetter {
		return recordOutcome{kind: recordFailed, err: a.err}
	}
	// A poisoned input is dead-lettered whatever the policy: it was
	// poisoned under DeadLetter, or as a Retry's fallback.
	return recordOutcome{kind: sendDeadLetter, outs: []*kgo.Record{deadLetter(pol.DeadLetterTopic(), a.in, a.err)}, err: a.err}
}

// notTheRecords reports whether a handler's error is no record's fault:
// it refused the processor's configuration (a windowed aggregation under
// Concurrency), or asked for a new session (a co-partitioned table not
// fetched). Run, or the session, ends with it, whatever the policy.
func notTheRecords(err error) bool {
	return errors.Is(err, eoskit.ErrInvalidConfig) || errors.As(err, new(*loop.RestartError))
}

// callHandler runs the handler, turning a panic and an output without a
// topic into errors, so that both follow the error policy.
// It also returns how long a handler that failed took (0 when it
// returned without error, whatever its outputs).
func (rn *runner) callHandler(ctx context.Context, r *kgo.Record) (outs []*kgo.Record, took time.Duration, err error) {
	took, err = rn.p.obs.HandleTimed("eos", func() (err error) {
		outs, err = rn.p.handler(ctx, r)
		return err
	})
	if err != nil {
		return nil, took, err
	}
	for _, o := range outs {
		if o == nil || o.Topic == "" {
			return nil, took, errors.New("eos: handler returned an output record with no topic")
		}
		if st := rn.p.cfg.state; st != nil && o.Topic == st.changelog {
			return nil, took, errors.New("eos: handler returned an output record to the changelog, which only the keyed state writes (use StateOf)")
		}
	}
	return outs, took, nil
}

func deadLetter(topic string, in *kgo.Record, cause error) *kgo.Record {
	// The input's own dead-letter headers go: its producer chose them.
	headers := append(loop.WithoutDeadLetterHeaders(in.Headers),
		kgo.RecordHeader{Key: loop.HeaderError, Value: []byte(cause.Error())},
		kgo.RecordHeader{Key: loop.HeaderSourceTopic, Value: []byte(in.Topic)},
		kgo.RecordHeader{Key: loop.HeaderSourcePartition, Value: strconv.AppendInt(nil, int64(in.Partition), 10)},
		kgo.RecordHeader{Key: loop.HeaderSourceOffset, Value: strconv.AppendInt(nil, in.Offset, 10)},
	)
	return &kgo.Record{Topic: topic, Key: in.Key, Value: in.Value, Headers: headers}
}
