package eos

import "time"

// ErrorPolicy is what a [Processor] does with an input record whose handler
// returned an error or panicked. Build one with [Retry], [DeadLetter] or
// [Stop]. Under every policy the transaction in which the handler failed is
// aborted first, so none of the outputs the batch had emitted so far is
// visible; the batch is then read again.
type ErrorPolicy struct {
	kind    policyKind
	backoff time.Duration
	topic   string
}

type policyKind int8

const (
	policyStop policyKind = iota
	policyRetry
	policyDeadLetter
)

// Stop makes the processor abort and return a *HandlerError naming the
// record's topic, partition and offset. The record's offset is not
// committed, so the record is read again when the processor next starts.
// This is the default.
func Stop() ErrorPolicy { return ErrorPolicy{kind: policyStop} }

// Retry makes the processor abort, wait backoff, and process the record
// again, for as long as the handler keeps failing: use it for errors that go
// away (a dependency that is down), not for records that can never succeed,
// which would hold their partition up forever.
func Retry(backoff time.Duration) ErrorPolicy {
	return ErrorPolicy{kind: policyRetry, backoff: backoff}
}

// DeadLetter makes the processor write the failing input record to topic
// (same key, value and headers, plus eoskit-error, eoskit-source-topic,
// eoskit-source-partition and eoskit-source-offset headers) inside the same
// transaction that commits its offset, and go on with the next record. The
// record is then either in the dead-letter topic with its offset committed,
// or neither: never lost, never both twice.
//
// A record is dead-lettered when its handler fails or panics, or when one
// of its outputs fails for its own sake (too large, invalid). An output that
// fails for a reason that is no record's fault (a missing topic, a refused
// ACL, a delivery timeout) sends nothing to the dead-letter topic: the
// session restarts with backoff, and Run eventually returns the error. A
// dead letter that cannot be written is tried 4 times with a growing
// backoff (1 s, 2 s, 4 s), then Run returns a *DeadLetterError.
func DeadLetter(topic string) ErrorPolicy { return ErrorPolicy{kind: policyDeadLetter, topic: topic} }

func (p ErrorPolicy) String() string {
	switch p.kind {
	case policyRetry:
		return "retry every " + p.backoff.String()
	case policyDeadLetter:
		return "dead-letter to " + p.topic
	}
	return "stop"
}
