package eoskit

import (
	"errors"
	"slices"
	"strconv"
	"time"
)

// ErrorPolicy is what a runner (an eos Processor, an offsetstore Runner,
// a dedup Consumer) does with an input record whose handler returned an
// error or panicked, or whose output failed for its own sake: [Stop] (the
// default), [Retry] (then, with [ErrorPolicy.Then], Stop or a dead
// letter), the runner's own DeadLetter (eos.DeadLetter(topic) writes to a
// topic; offsetstore.DeadLetter() and dedup.DeadLetter() park in the
// database), or [Classify] to choose among them by the error. It is one
// type for every runner; a runner's constructor refuses, with a
// *[ConfigError] naming OnHandlerError, a policy it cannot carry out (a
// dead-letter topic where records are parked in a table, say). What each
// policy does to the runner's transaction is said at the runner's
// OnHandlerError.
//
// The zero value is Stop.
type ErrorPolicy struct {
	kind     PolicyKind
	backoff  time.Duration
	attempts int
	then     *ErrorPolicy
	topic    string
	rules    []ErrorRule
}

// PolicyKind tells the policies apart, for a test of a classification
// (p.For(err).Kind()) and for the runners.
type PolicyKind int8

// The policies.
const (
	PolicyStop PolicyKind = iota
	PolicyRetry
	PolicyDeadLetter
)

// Stop makes the runner end Run with a *[RecordError] naming the record,
// once whatever the runner commits before it is committed; the record's
// offset is not committed, so it is read again when the runner next
// starts. The default.
func Stop() ErrorPolicy { return ErrorPolicy{kind: PolicyStop} }

// Retry makes the runner undo the record's attempt (abort or roll back),
// pause, and process it again, up to attempts times in all; then
// [ErrorPolicy.Then]'s fallback applies (Stop unless another is given).
// The pauses start at backoff and double each attempt up to 30 s (or
// backoff, if larger), each drawn at random from its upper half so that
// instances failing together do not retry in step; a cancelled ctx ends
// the pause. attempts 0 retries for as long as the handler fails: only for
// errors that go away (a dependency that is down), since a record that
// can never succeed then holds its partition up for good.
func Retry(backoff time.Duration, attempts int) ErrorPolicy {
	return ErrorPolicy{kind: PolicyRetry, backoff: backoff, attempts: attempts}
}

// DeadLetterTo is the dead-letter policy the runners' own DeadLetter
// functions return: to topic for eos.DeadLetter(topic), to the database
// ("" topic) for offsetstore's and dedup's. Use those: each says what a
// dead letter is for its runner, and each runner refuses the other kind.
func DeadLetterTo(topic string) ErrorPolicy {
	return ErrorPolicy{kind: PolicyDeadLetter, topic: topic}
}

// Then returns the Retry p with fallback applied once its attempts have
// all failed: Stop or a DeadLetter, for example
// Retry(100*time.Millisecond, 5).Then(eos.DeadLetter("orders-dlq")). The
// runner's constructor refuses a fallback on anything but a Retry with a
// number of attempts.
func (p ErrorPolicy) Then(fallback ErrorPolicy) ErrorPolicy {
	p.then = &fallback
	return p
}

// Kind is p's own policy, its rules left out (call it on what
// [ErrorPolicy.For] returned).
func (p ErrorPolicy) Kind() PolicyKind { return p.kind }

func (k PolicyKind) String() string {
	switch k {
	case PolicyRetry:
		return "retry"
	case PolicyDeadLetter:
		return "dead-letter"
	}
	return "stop"
}

// Backoff is a Retry's first pause (0 for other policies). Like Kind,
// Attempts, Fallback and Final, it reads p's own policy, its rules left
// out: call it on what [ErrorPolicy.For] returned.
func (p ErrorPolicy) Backoff() time.Duration { return p.backoff }

// Attempts is how many times a Retry runs the handler in all (0: without
// end; 0 for other policies). See Backoff on classified policies.
func (p ErrorPolicy) Attempts() int { return p.attempts }

// Fallback is what applies after a Retry's last attempt: its Then, or
// Stop. See Backoff on classified policies.
func (p ErrorPolicy) Fallback() ErrorPolicy {
	if p.then == nil {
		return Stop()
	}
	return *p.then
}

// Final reports whether attempt (from 1), having failed, was the last
// that p allows: for a Retry, its fallback applies now; for any other
// policy, every attempt is final. See Backoff on classified policies.
func (p ErrorPolicy) Final(attempt int) bool {
	return p.kind != PolicyRetry || (p.attempts > 0 && attempt >= p.attempts)
}

// Validate reports what makes p impossible to run, whatever the runner: a
// negative backoff or attempts, a fallback on anything but a Retry with a
// number of attempts, a fallback that retries or classifies, a rule
// without a target. The runners' constructors call it (and add their own
// refusals); a nil result does not mean a runner takes p.
func (p ErrorPolicy) Validate() error {
	switch {
	case p.then != nil && len(p.rules) > 0:
		return errors.New("Then on a Classify is ambiguous: give each Retry inside it its own Then")
	case p.then != nil && len(p.then.rules) > 0:
		return errors.New("a Retry's fallback must be Stop or DeadLetter, not a Classify: classify around the Retry instead")
	case p.kind == PolicyRetry && p.backoff < 0:
		return errors.New("Retry backoff must not be negative")
	case p.kind == PolicyRetry && p.attempts < 0:
		return errors.New("Retry attempts must not be negative (0 retries without end)")
	case p.kind == PolicyRetry && p.attempts == 0 && p.then != nil:
		return errors.New("a Retry without end (0 attempts) never reaches its fallback: give it a number of attempts")
	case p.then != nil && p.kind != PolicyRetry:
		return errors.New("only a Retry has a fallback")
	case p.then != nil && p.then.kind == PolicyRetry:
		return errors.New("a Retry's fallback must be Stop or DeadLetter, not another Retry")
	case p.then != nil && p.then.then != nil:
		return errors.New("a Retry's fallback has no fallback of its own: " + p.then.String() + " cannot take Then")
	}
	return p.validateRules()
}

// DeadLetters reports whether p sends a record anywhere but back to its
// handler: it dead-letters, at once or once its retries run out, for some
// error at least (one of its rules may).
func (p ErrorPolicy) DeadLetters() bool {
	return !p.each(func(q ErrorPolicy) bool { return !q.deadLetters() })
}

// Retries reports whether p retries a record for some error (its own
// policy or one its rules name).
func (p ErrorPolicy) Retries() bool {
	return !p.each(func(q ErrorPolicy) bool { return q.kind != PolicyRetry })
}

func (p ErrorPolicy) deadLetters() bool {
	return p.kind == PolicyDeadLetter || p.kind == PolicyRetry && p.then != nil && p.then.kind == PolicyDeadLetter
}

// DeadLetterTopic is the dead-letter topic of p or of its fallback (p's
// own, its rules left out: call it on what [ErrorPolicy.For] returned);
// "" for a dead letter to the database or no dead letter.
func (p ErrorPolicy) DeadLetterTopic() string {
	if p.kind == PolicyRetry && p.then != nil {
		return p.then.topic
	}
	return p.topic
}

// DeadLetterTopics lists, once each and in the order met, the topics that
// p and its rules dead-letter to; a dead letter without a topic (to the
// database) lists "".
func (p ErrorPolicy) DeadLetterTopics() []string {
	var topics []string
	p.each(func(q ErrorPolicy) bool {
		if q.deadLetters() && !slices.Contains(topics, q.DeadLetterTopic()) {
			topics = append(topics, q.DeadLetterTopic())
		}
		return true
	})
	return topics
}

func (p ErrorPolicy) String() string {
	if len(p.rules) > 0 {
		base := p
		base.rules = nil
		return base.String() + " otherwise" + p.rulesString()
	}
	switch p.kind {
	case PolicyRetry:
		s := "retry from " + p.backoff.String()
		if p.attempts == 0 {
			return s + " without end"
		}
		return s + ", " + strconv.Itoa(p.attempts) + " attempts, then " + p.Fallback().String()
	case PolicyDeadLetter:
		if p.topic != "" {
			return "dead-letter to " + p.topic
		}
		return "dead-letter"
	}
	return "stop"
}
