package dedup

import (
	"time"

	"github.com/eoskit/eoskit/internal/loop"
)

// ErrorPolicy is what a [Consumer] does with a record whose handler fails
// or panics: [Stop] (the default), [Retry] (then, with [ErrorPolicy.Then],
// Stop or DeadLetter) or [DeadLetter], or [Classify] to choose among them
// by the error: the same policies as eos's and offsetstore's. The
// record's writes are rolled back first (the batch's database
// transaction, with its claims, or, once the batch met a failure, its
// writes since a savepoint), so nothing of the failed attempt is applied
// or claimed; see the package documentation.
type ErrorPolicy struct{ p loop.Policy }

// Stop makes Run return a *[eoskit.RecordError] naming the record. The default.
func Stop() ErrorPolicy { return ErrorPolicy{loop.Stop()} }

// Retry rolls the batch back, pauses, and runs it again, until the record
// has failed attempts times in all; then [ErrorPolicy.Then]'s fallback
// applies (Stop unless another is given). The pauses start at backoff and
// double each attempt up to 30 s (or backoff, if larger), each drawn at
// random from its upper half; a cancelled ctx ends the pause. attempts 0
// retries for as long as the handler fails, holding the batch up.
func Retry(backoff time.Duration, attempts int) ErrorPolicy {
	return ErrorPolicy{loop.Retry(backoff, attempts)}
}

// Then returns the Retry p with fallback applied once its attempts have all
// failed: [Stop] or [DeadLetter]. NewConsumer refuses a fallback on
// anything but a Retry with a number of attempts.
func (p ErrorPolicy) Then(fallback ErrorPolicy) ErrorPolicy {
	return ErrorPolicy{p.p.WithFallback(fallback.p)}
}

// DeadLetter parks the record (key, value, coordinates, error) in the
// eoskit_dead_letters table, which the store's Migrate creates, in the
// transaction that claims its id and applies the rest of its batch, and
// goes on: a copy of it that arrives later is skipped like any processed
// id.
func DeadLetter() ErrorPolicy { return ErrorPolicy{loop.Policy{Kind: loop.PolicyDeadLetter}} }

func (p ErrorPolicy) String() string { return p.p.String() }
