package loop

import (
	"errors"
	"time"

	"github.com/eoskit/eoskit"
)

// Fate is what the error policy gives a record whose handler failed.
type Fate int8

const (
	// FateStop ends Run with a *eoskit.RecordError naming the record.
	FateStop Fate = iota
	// FateRetry undoes the attempt, pauses for Decision.Backoff and runs
	// the record again.
	FateRetry
	// FateDeadLetter dead-letters (eos) or parks (offsetstore, dedup) the
	// record and goes on.
	FateDeadLetter
)

func (f Fate) String() string {
	switch f {
	case FateRetry:
		return "retry"
	case FateDeadLetter:
		return "dead-letter"
	}
	return "stop"
}

// Decision is the fate of one failure of a record, and what it needs.
type Decision struct {
	Fate Fate
	// Backoff is the pause before the next attempt (FateRetry only).
	Backoff time.Duration
	// Topic is the dead-letter topic, "" for the database (FateDeadLetter
	// only).
	Topic string
}

// Decide is the one failure decision every runner makes: the fate of a
// record whose handler failed with err for the attempts-th time (from 1,
// counted across the policy's rules). The rule that matches err applies; a
// Retry with attempts left retries, and once they ran out its fallback
// applies. Pure: the runners carry the decision out.
func Decide(p eoskit.ErrorPolicy, err error, attempts int) Decision {
	pol := p.For(err)
	if pol.Kind() == eoskit.PolicyRetry {
		if !pol.Final(attempts) {
			return Decision{Fate: FateRetry, Backoff: RecordBackoff(attempts, pol)}
		}
		pol = pol.Fallback()
	}
	if pol.Kind() == eoskit.PolicyDeadLetter {
		return Decision{Fate: FateDeadLetter, Topic: pol.DeadLetterTopic()}
	}
	return Decision{Fate: FateStop}
}

// CheckPolicy is the check every runner's constructor makes of its error
// policy (the option OnHandlerError): p must be valid, and its dead
// letters must go where the runner puts them: to topics (toTopics, eos)
// or to the database (offsetstore, dedup).
func CheckPolicy(p eoskit.ErrorPolicy, toTopics bool) error {
	if err := p.Validate(); err != nil {
		return err
	}
	for _, t := range p.DeadLetterTopics() {
		switch {
		case toTopics && t == "":
			return errors.New("DeadLetter needs a topic: offsetstore's and dedup's DeadLetter park in a table, eos.DeadLetter(topic) writes to a topic")
		case !toTopics && t != "":
			return errors.New("a dead letter to topic " + t + " is eos's: this runner parks in its table (its own DeadLetter())")
		}
	}
	return nil
}
