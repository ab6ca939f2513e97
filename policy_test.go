package eoskit

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
	dlq := DeadLetterTo("dlq")
	retry := Retry(10*time.Millisecond, 3).Then(dlq)
	p := Classify(Stop(),
		When(errParse, dlq),
		WhenAs[timeoutError](retry),
		WhenFunc(func(err error) bool { return strings.Contains(err.Error(), "parse") }, Retry(time.Second, 0)),
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
		if got := p.For(c.err); got.String() != c.want || len(got.rules) != 0 {
			t.Errorf("%s: For(%v) = %q (%d rules); want %q without rules", c.name, c.err, got, len(got.rules), c.want)
		}
	}

	// A classification as another's fallback: its rules come after the
	// outer ones, its own policy last.
	outer := Classify(Classify(dlq, When(context.DeadlineExceeded, retry)), When(errParse, Stop()))
	for err, want := range map[error]string{errParse: "stop", context.DeadlineExceeded: retry.String(), net.ErrClosed: dlq.String()} {
		if got := outer.For(err).String(); got != want {
			t.Errorf("nested: For(%v) = %q; want %q", err, got, want)
		}
	}
	// An interface type: anything with Timeout() bool.
	var netErr error = &net.DNSError{IsTimeout: true}
	if got := Classify(Stop(), WhenAs[interface {
		error
		Timeout() bool
	}](retry)).For(fmt.Errorf("dial: %w", netErr)); got.String() != retry.String() {
		t.Errorf("WhenAs[interface{ error; Timeout() bool }] = %q; want the retry", got)
	}
}

// Validate refuses what cannot run: a rule without a target, a rule whose
// policy is itself invalid, a Classify as a Retry's fallback.
func TestValidateClassified(t *testing.T) {
	for name, p := range map[string]ErrorPolicy{
		"nil target":         Classify(Stop(), When(nil, Stop())),
		"nil func":           Classify(Stop(), WhenFunc(nil, Stop())),
		"invalid rule":       Classify(Stop(), When(errParse, Retry(-time.Second, 1))),
		"classify as a Then": Retry(time.Second, 2).Then(Classify(Stop(), When(errParse, Stop()))),
	} {
		if err := p.Validate(); err == nil {
			t.Errorf("%s: Validate() = nil; want a refusal", name)
		}
	}
	if err := Classify(Stop(), When(errParse, Retry(time.Second, 2).Then(DeadLetterTo("")))).Validate(); err != nil {
		t.Errorf("a valid classification refused: %v", err)
	}
}

// DeadLetters and DeadLetterTopics look into the rules: a policy that
// stops otherwise but dead-letters parse errors dead-letters.
func TestDeadLetterTopicsOfRules(t *testing.T) {
	p := Classify(Stop(),
		When(errParse, DeadLetterTo("parse-dlq")),
		WhenAs[timeoutError](Retry(time.Second, 2).Then(DeadLetterTo("slow-dlq"))),
		WhenFunc(func(error) bool { return true }, DeadLetterTo("parse-dlq")),
	)
	if !p.DeadLetters() {
		t.Error("DeadLetters() = false; want true")
	}
	if got := fmt.Sprint(p.DeadLetterTopics()); got != "[parse-dlq slow-dlq]" {
		t.Errorf("DeadLetterTopics() = %s; want [parse-dlq slow-dlq]", got)
	}
	if !Classify(Stop(), When(errParse, Retry(time.Second, 0))).Retries() || p.Retries() != true || Classify(Stop(), When(errParse, DeadLetterTo("d"))).Retries() {
		t.Error("Retries() does not see a rule's Retry, or sees one where there is none")
	}
	if Classify(Stop(), When(errParse, Retry(time.Second, 0))).DeadLetters() {
		t.Error("a classification without dead letters reports DeadLetters")
	}
	if got := p.String(); !strings.HasPrefix(got, "stop otherwise; errors.Is parse: dead-letter to parse-dlq; errors.As eoskit.timeoutError: retry") {
		t.Errorf("String() = %q", got)
	}
}

// Classify copies its rules: a caller changing its slice afterwards does
// not change a policy already validated and running (the per-package
// wrappers copied; the first shared Classify aliased it).
func TestClassifyCopiesItsRules(t *testing.T) {
	rs := []ErrorRule{When(errParse, DeadLetterTo("dlq"))}
	p := Classify(Stop(), rs...)
	rs[0] = When(errParse, Retry(time.Second, 0))
	if got := p.For(errParse).String(); got != "dead-letter to dlq" {
		t.Fatalf("after the caller changed its slice, For(errParse) = %q", got)
	}
}

// Then on a Classify, and a fallback with a fallback of its own, are
// refused: each would silently apply to less than it seems to. A typed
// nil target matches nothing and is refused, without a panic.
func TestValidateRefusesAmbiguousFallbacks(t *testing.T) {
	var typedNil *timeoutError
	for name, p := range map[string]ErrorPolicy{
		"Then on a Classify":      Classify(Retry(time.Second, 3), When(errParse, Retry(time.Second, 5))).Then(DeadLetterTo("dlq")),
		"a fallback's fallback":   Retry(time.Second, 3).Then(Stop().Then(DeadLetterTo(""))),
		"a typed nil When target": Classify(Stop(), When(typedNil, Stop())),
	} {
		if err := p.Validate(); err == nil {
			t.Errorf("%s: Validate() = nil; want a refusal", name)
		}
	}
}
