package eos

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/loop"
)

// failures is what the processor remembers about inputs that failed, across
// transactions and sessions, until a transaction that covers them commits
// (committed) or the policy lets them go.
type failures struct {
	// mu guards poisoned and tooSlow, which the lanes of a batch share.
	mu sync.Mutex
	// poisoned holds the inputs to dead-letter without running their
	// handler (their outputs could not be written, their handler was too
	// slow, or their dead letter is tried again), with why.
	poisoned map[coords]error
	// tooSlow counts, per input, the transactions that ran out of their
	// budget with it alone in its handler.
	tooSlow map[coords]int
	// attempts counts, per input, the attempts of the Retry policy so
	// far, until the input commits or its fallback applies;
	// deadLetterFailures counts the dead letters that could not be
	// written. Only Run's goroutine uses them, between batches.
	attempts           map[coords]int
	deadLetterFailures map[coords]int
}

func newFailures() *failures {
	return &failures{poisoned: map[coords]error{}, tooSlow: map[coords]int{}, attempts: map[coords]int{}, deadLetterFailures: map[coords]int{}}
}

// poison makes the next transactions dead-letter the input at, for cause,
// without running its handler, until one of them commits.
func (f *failures) poison(at coords, cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.poisoned[at] = cause
}

// poisonedBy returns why the input at is to be dead-lettered without its
// handler, if it is.
func (f *failures) poisonedBy(at coords) (cause error, poisoned bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.poisoned) == 0 { // hashing the topic per record costs
		return nil, false
	}
	cause, poisoned = f.poisoned[at]
	return cause, poisoned
}

// slowAloneToBlame is how many transactions an input's handler must run
// out of budget in, alone, before the input is blamed: once could be a
// passing outage or pause.
const slowAloneToBlame = 2

// ranOutAlone counts a transaction that ran out of its budget with the
// input at alone in its handler, and returns how many did so far. From
// slowAloneToBlame on, the input is blamed (see decide) and the count
// starts over.
func (f *failures) ranOutAlone(at coords) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.tooSlow[at] + 1
	if n >= slowAloneToBlame {
		delete(f.tooSlow, at)
	} else {
		f.tooSlow[at] = n
	}
	return n
}

// committed forgets what the committed batch b settled: the dead letters it
// wrote (their poison and failure counts), the slowness of its first input,
// and the retry counts of the inputs it covered.
func (f *failures) committed(b *batch) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for at := range b.deadLetters {
		delete(f.deadLetterFailures, at)
		delete(f.poisoned, at)
	}
	delete(f.tooSlow, b.first)
	for at := range f.attempts {
		if end, ok := b.ends[topicPartition{at.topic, at.partition}]; ok && at.offset < end {
			delete(f.attempts, at)
		}
	}
}

// afterFailure applies the error policy once a batch ended without a
// commit. It returns a non-nil error when Run must return it.
func (p *Processor) afterFailure(ctx context.Context, rn *runner, b *batch) error {
	// The inputs the batch dead-lettered are dead-lettered again when it
	// is read again, without their handlers: a record whose error the
	// policy dead-letters is handled once, whatever else aborted its
	// transaction.
	for at, cause := range b.deadLetters {
		p.failures.poison(at, cause)
	}
	at, err := b.failedAt, b.failed
	if err == nil {
		at, err = b.produceErr()
		if err == nil {
			return nil
		}
		// No ACL to write the output (or the dead letter) is no
		// record's fault, and waiting will not grant it.
		if authz.Refused(err) {
			b.mu.Lock()
			topic := b.produceTopic
			b.mu.Unlock()
			return authz.Write(topic, p.cfg.txnID, p.cfg.group, err)
		}
		if recordSpecific(err) && b.failedInputCount() > 1 && !rn.isolate {
			// The outputs (or dead letters) of several inputs failed
			// alike: a produce batch the broker refused whole (a topic
			// whose max.message.bytes is below the producer's batch
			// size, say) fails every record in it, and the first is not
			// to blame. Read the batch again settling each input's
			// outputs alone.
			rn.isolate = true
			p.logger.Warn("eos: the outputs of several inputs failed alike; reading the batch again one input at a time to find whose fault it is", "err", err)
			return nil
		}
		if cause, ok := b.deadLetters[at]; ok {
			return p.deadLetterFailed(ctx, rn, at, cause, err)
		}
		// An output that failed for its own sake (too large, invalid) is
		// the input's failure too: the input follows the policy, so a
		// record that can never be written does not loop forever. Any
		// other produce failure (a missing topic, a refused ACL, a
		// delivery timeout) fails every record alike and is no record's
		// fault: the session restarts with backoff.
		if !recordSpecific(err) {
			return loop.Restart(fmt.Errorf("produce failed, not because of the input %s[%d]@%d: %w", at.topic, at.partition, at.offset, err))
		}
	}
	if notTheRecords(err) {
		return err // a ConfigError ends Run, a RestartError the session
	}
	return p.applyPolicy(ctx, at, err)
}

// applyPolicy applies the error policy to the input at, whose handler (or
// output) failed with err, in a batch that was aborted: Retry pauses and
// lets the batch be read again, until its attempts run out and its
// fallback applies; DeadLetter poisons the input, so that the next
// transaction dead-letters it without running its handler; Stop returns a
// *[eoskit.RecordError].
func (p *Processor) applyPolicy(ctx context.Context, at coords, err error) error {
	p.failures.attempts[at]++ // across the rules, should the input's error change
	attempts := p.failures.attempts[at]
	d := loop.Decide(p.cfg.onError, err, attempts)
	switch d.Fate {
	case loop.FateRetry:
		p.logger.Warn("eos: handler failed; retrying", "topic", at.topic, "partition", at.partition, "offset", at.offset,
			"err", loop.ErrorText(err), "attempt", attempts, "backoff", d.Backoff)
		loop.Sleep(ctx, d.Backoff)
		return nil
	case loop.FateDeadLetter:
		delete(p.failures.attempts, at)
		p.failures.poison(at, err)
		return nil
	}
	delete(p.failures.attempts, at)
	return &eoskit.RecordError{Topic: at.topic, Partition: at.partition, Offset: at.offset, Attempts: attempts, Err: err}
}

// maxDeadLetterAttempts bounds how often one input's dead letter is tried
// before Run gives up with a *DeadLetterError.
const maxDeadLetterAttempts = 4

// deadLetterFailed handles a dead letter that could not be written (too
// large with the headers added, a missing dead-letter topic, no write ACL
// on it): it tries again after a growing backoff, a few times, then returns
// a *DeadLetterError naming the input and both errors. The input's offset
// is not committed: it is read again when the processor next starts.
func (p *Processor) deadLetterFailed(ctx context.Context, rn *runner, at coords, cause, err error) error {
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		// The topic was there when Run started. Deleted since (a fresh
		// look confirms it), no retry mends it; the input's offset is
		// not committed.
		if cerr := p.checkDeadLetterTopic(ctx); cerr != nil {
			return cerr // naming the topic found missing (with several rules, not always this input's)
		}
	}
	p.failures.deadLetterFailures[at]++
	attempts := p.failures.deadLetterFailures[at]
	if attempts >= maxDeadLetterAttempts {
		delete(p.failures.deadLetterFailures, at)
		return &DeadLetterError{Topic: at.topic, Partition: at.partition, Offset: at.offset,
			DeadLetterTopic: p.cfg.onError.For(cause).DeadLetterTopic(), Attempts: attempts, Cause: cause, Err: err}
	}
	backoff := time.Second << (attempts - 1)
	p.logger.Warn("eos: writing a dead letter failed; retrying", "topic", at.topic, "partition", at.partition, "offset", at.offset,
		"dead_letter_topic", p.cfg.onError.For(cause).DeadLetterTopic(), "err", err, "attempt", attempts, "backoff", backoff)
	p.failures.poison(at, cause)
	loop.Sleep(ctx, backoff)
	return nil
}

// recordSpecific reports whether a produce error is the record's own fault,
// so that the input that made it may be blamed.
func recordSpecific(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage) || errors.Is(err, kerr.InvalidTimestamp)
}
