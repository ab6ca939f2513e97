package loop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

var errParse = errors.New("parse")

type timeoutError struct{}

func (timeoutError) Error() string { return "timed out" }

// For picks the policy of the first rule whose match holds, trying them in
// order, through wrapping (errors.Is, errors.As), and the policy's own for
// an error no rule matches; a classified fallback is resolved too.
func TestForChoosesByError(t *testing.T) {
	dlq := Policy{Kind: PolicyDeadLetter, Topic: "dlq"}
	retry := Retry(10*time.Millisecond, 3).WithFallback(dlq)
	p := Classify(Stop(),
		Is(errParse, dlq),
		As[timeoutError](retry),
		Func(func(err error) bool { return strings.Contains(err.Error(), "parse") }, Retry(time.Second, 0)),
	)
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"wrapped sentinel", fmt.Errorf("record 7: %w", errParse), dlq.String()},
		{"both rules match: the first wins", fmt.Errorf("%w and %w", timeoutError{}, errParse), dlq.String()},
		{"type in the chain", fmt.Errorf("call: %w", timeoutError{}), retry.String()},
		{"func", errors.New("cannot parse the header"), Retry(time.Second, 0).String()},
		{"none", os.ErrPermission, Stop().String()},
		{"nil", nil, Stop().String()},
	}
	for _, c := range cases {
		if got := p.For(c.err); got.String() != c.want || len(got.Rules) != 0 {
			t.Errorf("%s: For(%v) = %q (%d rules); want %q without rules", c.name, c.err, got, len(got.Rules), c.want)
		}
	}

	// A classification as another's fallback: its rules come after the
	// outer ones, its own policy last.
	outer := Classify(Classify(dlq, Is(context.DeadlineExceeded, retry)), Is(errParse, Stop()))
	for err, want := range map[error]string{errParse: "stop", context.DeadlineExceeded: retry.String(), net.ErrClosed: dlq.String()} {
		if got := outer.For(err).String(); got != want {
			t.Errorf("nested: For(%v) = %q; want %q", err, got, want)
		}
	}
	// An interface type: anything with Timeout() bool.
	var netErr error = &net.DNSError{IsTimeout: true}
	if got := Classify(Stop(), As[interface {
		error
		Timeout() bool
	}](retry)).For(fmt.Errorf("dial: %w", netErr)); got.String() != retry.String() {
		t.Errorf("As[interface{ error; Timeout() bool }] = %q; want the retry", got)
	}
}

// Validate refuses what cannot run: a rule without a target, a rule whose
// policy is itself invalid, a Classify as a Retry's fallback.
func TestValidateClassified(t *testing.T) {
	for name, p := range map[string]Policy{
		"nil target":         Classify(Stop(), Is(nil, Stop())),
		"nil func":           Classify(Stop(), Func(nil, Stop())),
		"invalid rule":       Classify(Stop(), Is(errParse, Retry(-time.Second, 1))),
		"classify as a Then": Retry(time.Second, 2).WithFallback(Classify(Stop(), Is(errParse, Stop()))),
	} {
		if err := p.Validate(); err == nil {
			t.Errorf("%s: Validate() = nil; want a refusal", name)
		}
	}
	if err := Classify(Stop(), Is(errParse, Retry(time.Second, 2).WithFallback(Policy{Kind: PolicyDeadLetter}))).Validate(); err != nil {
		t.Errorf("a valid classification refused: %v", err)
	}
}

// DeadLetters and DeadLetterTopics look into the rules: a policy that
// stops otherwise but dead-letters parse errors dead-letters.
func TestDeadLetterTopicsOfRules(t *testing.T) {
	p := Classify(Stop(),
		Is(errParse, Policy{Kind: PolicyDeadLetter, Topic: "parse-dlq"}),
		As[timeoutError](Retry(time.Second, 2).WithFallback(Policy{Kind: PolicyDeadLetter, Topic: "slow-dlq"})),
		Func(func(error) bool { return true }, Policy{Kind: PolicyDeadLetter, Topic: "parse-dlq"}),
	)
	if !p.DeadLetters() {
		t.Error("DeadLetters() = false; want true")
	}
	if got := fmt.Sprint(p.DeadLetterTopics()); got != "[parse-dlq slow-dlq]" {
		t.Errorf("DeadLetterTopics() = %s; want [parse-dlq slow-dlq]", got)
	}
	if Classify(Stop(), Is(errParse, Retry(time.Second, 0))).DeadLetters() {
		t.Error("a classification without dead letters reports DeadLetters")
	}
	if got := p.String(); !strings.HasPrefix(got, "stop otherwise; errors.Is parse: dead-letter to parse-dlq; errors.As loop.timeoutError: retry") {
		t.Errorf("String() = %q", got)
	}
}

// A handler that panics with an error is classified by that error, as one
// that returned it would be.
func TestRecoverKeepsAPanickingErrorForTheRules(t *testing.T) {
	errParse := errors.New("parse")
	err := Recover("eos", func() error { panic(fmt.Errorf("report 7: %w", errParse)) })
	if !errors.Is(err, errParse) || !strings.Contains(err.Error(), "handler panicked") {
		t.Fatalf("Recover = %v, want a panic wrapping errParse", err)
	}
	if err := Recover("eos", func() error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Recover of a string panic = %v", err)
	}
}
