package offsetstore

import (
	"time"

	"github.com/eoskit/eoskit/internal/loop"
)

// ErrorPolicy is what a [Runner] does with a record whose handler fails or
// panics: [Stop] (the default), [Retry] (then, with [ErrorPolicy.Then],
// Stop or DeadLetter) or [DeadLetter], or [Classify] to choose among them
// by the error: the same policies as eos's and dedup's. The record is the
// one the handler names with [Reject], or, when it names none, the one
// found by splitting the batch in halves; either way inside the batch's
// database transaction, each handler call under a savepoint that its
// failure rolls back to (see the package documentation).
type ErrorPolicy struct{ p loop.Policy }

// Stop makes Run return a *[eoskit.RecordError] naming the record, once the records
// before it in its batch committed with their offsets. The default.
func Stop() ErrorPolicy { return ErrorPolicy{loop.Stop()} }

// Retry rolls the batch's transaction back whole (no lock is held through
// the pause), pauses, and runs the batch again, until the record has
// failed attempts times in all; then [ErrorPolicy.Then]'s fallback applies
// (Stop unless another is given), inside the transaction: a DeadLetter
// fallback parks the record there and the batch goes on. A record of the
// batch already parked is parked again without its handler when the batch
// runs again. The pauses start at backoff and double
// each attempt up to 30 s (or backoff, if larger), each drawn at random
// from its upper half; a cancelled ctx ends the pause. attempts 0 retries
// for as long as the handler fails, holding the record's partitions up.
func Retry(backoff time.Duration, attempts int) ErrorPolicy {
	return ErrorPolicy{loop.Retry(backoff, attempts)}
}

// Then returns the Retry p with fallback applied once its attempts have all
// failed: [Stop] or [DeadLetter]. NewRunner refuses a fallback on anything but a
// Retry with a number of attempts.
func (p ErrorPolicy) Then(fallback ErrorPolicy) ErrorPolicy {
	return ErrorPolicy{p.p.WithFallback(fallback.p)}
}

// DeadLetter parks the record (key, value, coordinates, error) in the
// eoskit_dead_letters table, in the same transaction that stores its offset
// and commits the rest of its batch, and goes on: the record is then parked
// with its offset stored, or neither.
func DeadLetter() ErrorPolicy { return ErrorPolicy{loop.Policy{Kind: loop.PolicyDeadLetter}} }

func (p ErrorPolicy) String() string { return p.p.String() }
