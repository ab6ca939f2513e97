package loop

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/eoskit/eoskit"
)

// Decide gives each failure its fate from the policy, the error and the
// attempts: a Retry retries until its attempts ran out, then its fallback
// applies; the matching rule wins; a pause grows with the attempts.
func TestDecide(t *testing.T) {
	errParse := errors.New("parse")
	p := eoskit.Classify(eoskit.Retry(time.Second, 3).Then(eoskit.DeadLetterTo("dlq")),
		eoskit.When(errParse, eoskit.DeadLetterTo("parse-dlq")),
		eoskit.When(io.EOF, eoskit.Stop()),
	)
	cases := []struct {
		err      error
		attempts int
		want     Fate
		topic    string
	}{
		{errors.New("down"), 1, FateRetry, ""},
		{errors.New("down"), 2, FateRetry, ""},
		{errors.New("down"), 3, FateDeadLetter, "dlq"},
		{fmt.Errorf("record 7: %w", errParse), 1, FateDeadLetter, "parse-dlq"},
		{fmt.Errorf("decode: %w", io.EOF), 1, FateStop, ""},
	}
	for _, c := range cases {
		d := Decide(p, c.err, c.attempts)
		if d.Fate != c.want || d.Topic != c.topic {
			t.Errorf("Decide(%v, attempt %d) = %s %q; want %s %q", c.err, c.attempts, d.Fate, d.Topic, c.want, c.topic)
		}
		// Attempt a pauses in the upper half of the backoff doubled a-1 times.
		if full := time.Second << (c.attempts - 1); d.Fate == FateRetry && (d.Backoff < full/2 || d.Backoff > full) {
			t.Errorf("attempt %d: backoff %s out of [%s, %s]", c.attempts, d.Backoff, full/2, full)
		}
	}
	// The pauses stop doubling at 30 s, or at the backoff when larger.
	for attempt, base := range map[int]time.Duration{20: time.Second, 3: time.Minute} {
		d := Decide(eoskit.Retry(base, 0), errParse, attempt)
		if limit := max(30*time.Second, base); d.Backoff < limit/2 || d.Backoff > limit {
			t.Errorf("attempt %d from %s: backoff %s, want within [%s, %s]", attempt, base, d.Backoff, limit/2, limit)
		}
	}
	if d := Decide(eoskit.Retry(0, 0), errParse, 1000); d.Fate != FateRetry || d.Backoff != 0 {
		t.Errorf("a Retry without end gave %+v at attempt 1000", d)
	}
	if d := Decide(eoskit.Stop(), errParse, 1); d.Fate != FateStop {
		t.Errorf("Stop gave %s", d.Fate)
	}
	if d := Decide(eoskit.Retry(time.Millisecond, 2), errParse, 2); d.Fate != FateStop {
		t.Errorf("a Retry without Then gave %s after its attempts; want stop", d.Fate)
	}
}

// CheckPolicy refuses a dead letter a runner cannot write: one without a
// topic for eos, one to a topic for the database runners, in a rule or a
// fallback as well.
func TestCheckPolicy(t *testing.T) {
	toTable := eoskit.Classify(eoskit.Stop(), eoskit.When(io.EOF, eoskit.Retry(time.Millisecond, 2).Then(eoskit.DeadLetterTo(""))))
	toTopic := eoskit.Classify(eoskit.Stop(), eoskit.When(io.EOF, eoskit.Retry(time.Millisecond, 2).Then(eoskit.DeadLetterTo("dlq"))))
	if err := CheckPolicy(toTable, false); err != nil {
		t.Errorf("a table dead letter refused by a database runner: %v", err)
	}
	if err := CheckPolicy(toTopic, true); err != nil {
		t.Errorf("a topic dead letter refused by eos: %v", err)
	}
	if CheckPolicy(toTable, true) == nil || CheckPolicy(toTopic, false) == nil {
		t.Error("a dead letter of the other kind was accepted")
	}
	if CheckPolicy(eoskit.Retry(-1, 2), false) == nil {
		t.Error("an invalid policy was accepted")
	}
}
