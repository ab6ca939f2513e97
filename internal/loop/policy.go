package loop

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// Policy is the error policy every runner applies to a record whose handler
// failed: stop, retry (a bounded number of times, then a fallback), or
// dead-letter. Each public package wraps it in its own ErrorPolicy type, so
// that a policy only one runner can carry out (eos's dead-letter topic) does
// not compile where it cannot apply.
type Policy struct {
	Kind PolicyKind
	// Backoff is the first pause of a retry, doubled each further attempt
	// (see [Backoff]).
	Backoff time.Duration
	// Attempts is how many times a retry runs the handler in all before
	// Then applies; 0 retries for as long as the handler fails.
	Attempts int
	// Then is what happens after the last attempt (Stop when nil).
	Then *Policy
	// Topic is where eos dead-letters; empty for the database runners.
	Topic string
	// Rules, tried in order by [Policy.For], choose another policy by the
	// handler's error; the fields above apply to an error none matches.
	Rules []Rule
}

// PolicyKind tells the policies apart.
type PolicyKind int8

// The policies.
const (
	PolicyStop PolicyKind = iota
	PolicyRetry
	PolicyDeadLetter
)

// Stop is the default policy.
func Stop() Policy { return Policy{Kind: PolicyStop} }

// Retry retries attempts times in all (0: without end) from backoff.
func Retry(backoff time.Duration, attempts int) Policy {
	return Policy{Kind: PolicyRetry, Backoff: backoff, Attempts: attempts}
}

// WithFallback returns p with then applied once its attempts run out. Only
// a retry has a fallback; a fallback that retries again is refused by
// Validate.
func (p Policy) WithFallback(then Policy) Policy {
	p.Then = &then
	return p
}

// Fallback is what applies after a retry's last attempt: Then, or Stop.
func (p Policy) Fallback() Policy {
	if p.Then == nil {
		return Stop()
	}
	return *p.Then
}

// Final reports whether attempt (from 1), having failed, was a retry's
// last: its fallback applies now.
func (p Policy) Final(attempt int) bool {
	return p.Kind != PolicyRetry || (p.Attempts > 0 && attempt >= p.Attempts)
}

// Validate checks p, and the policies its rules name, for the option that
// carries it (named in the error).
func (p Policy) Validate() error {
	switch {
	case p.Then != nil && len(p.Then.Rules) > 0:
		return errors.New("a Retry's fallback must be Stop or DeadLetter, not a Classify: classify around the Retry instead")
	case p.Kind == PolicyRetry && p.Backoff < 0:
		return errors.New("Retry backoff must not be negative")
	case p.Kind == PolicyRetry && p.Attempts < 0:
		return errors.New("Retry attempts must not be negative (0 retries without end)")
	case p.Kind == PolicyRetry && p.Attempts == 0 && p.Then != nil:
		return errors.New("a Retry without end (0 attempts) never reaches its fallback: give it a number of attempts")
	case p.Then != nil && p.Kind != PolicyRetry:
		return errors.New("only a Retry has a fallback")
	case p.Then != nil && p.Then.Kind == PolicyRetry:
		return errors.New("a Retry's fallback must be Stop or DeadLetter, not another Retry")
	}
	return p.validateRules()
}

// DeadLetters reports whether p sends a record anywhere but back to its
// handler: it dead-letters, at once or once its retries run out, for some
// error at least (one of its rules may).
func (p Policy) DeadLetters() bool {
	return !p.each(func(q Policy) bool { return !q.deadLetters() })
}

func (p Policy) deadLetters() bool {
	return p.Kind == PolicyDeadLetter || p.Kind == PolicyRetry && p.Then != nil && p.Then.Kind == PolicyDeadLetter
}

// DeadLetterTopic is the dead-letter topic of p or of its fallback (p's
// own, leaving its rules out: call it on what [Policy.For] returned).
func (p Policy) DeadLetterTopic() string {
	if p.Kind == PolicyRetry && p.Then != nil {
		return p.Then.Topic
	}
	return p.Topic
}

// DeadLetterTopics lists, once each and in the order met, the topics that
// p and its rules dead-letter to; a policy that dead-letters without a
// topic lists "".
func (p Policy) DeadLetterTopics() []string {
	var topics []string
	p.each(func(q Policy) bool {
		if q.deadLetters() && !slices.Contains(topics, q.DeadLetterTopic()) {
			topics = append(topics, q.DeadLetterTopic())
		}
		return true
	})
	return topics
}

func (p Policy) String() string {
	if len(p.Rules) > 0 {
		base := p
		base.Rules = nil
		return base.String() + " otherwise" + p.rulesString()
	}
	switch p.Kind {
	case PolicyRetry:
		s := "retry from " + p.Backoff.String()
		if p.Attempts == 0 {
			return s + " without end"
		}
		return s + ", " + strconv.Itoa(p.Attempts) + " attempts, then " + p.Fallback().String()
	case PolicyDeadLetter:
		if p.Topic != "" {
			return "dead-letter to " + p.Topic
		}
		return "dead-letter"
	}
	return "stop"
}

// Backoff is the pause before retry number attempt (from 1): base doubled
// each attempt, capped at limit (or at base when base is larger), and
// drawn at random from its upper half, so that instances failing together
// do not retry in step. A base of 0 gives 0.
func Backoff(attempt int, base, limit time.Duration) time.Duration {
	if base <= 0 {
		return 0
	}
	limit = max(limit, base)
	d := base
	for i := 1; i < attempt && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return d/2 + rand.N(d/2+1)
}

// Retry pauses for work that failed for no record's fault (a database or
// broker error): from retryBase, doubling, up to retryLimit, jittered.
const (
	retryBase  = 200 * time.Millisecond
	retryLimit = 5 * time.Second
)

// PauseBeforeRetry sleeps before retry number attempt (from 1) of work that
// failed for no record's fault, the one backoff all runners use for it; it
// reports false when ctx ended first.
func PauseBeforeRetry(ctx context.Context, attempt int) bool {
	return Sleep(ctx, Backoff(attempt, retryBase, retryLimit))
}
