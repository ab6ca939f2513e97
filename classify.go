package eoskit

import (
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// ErrorRule is one rule of [Classify]: a policy and the handler errors it
// applies to.
type ErrorRule struct {
	match func(error) bool
	// name says what match looks for, for String and for the error that
	// refuses a rule without match.
	name   string
	policy ErrorPolicy
}

// Classify returns the error policy that chooses by the handler's error,
// as Spring Kafka's error classifier does: the rules are tried in order,
// the first that matches the error gives the policy, and otherwise applies
// to an error none matches. For example
//
//	eoskit.Classify(eoskit.Stop(),
//		eoskit.When(ErrParse, eos.DeadLetter("orders-dlq")),
//		eoskit.WhenAs[*TimeoutError](eoskit.Retry(100*time.Millisecond, 5)),
//	)
//
// dead-letters a record that cannot be parsed at once, without a retry,
// retries one that timed out, and stops on anything else. The rules apply
// to whatever the policy applies to (an error, a panic); a runner's
// attempts at a record are counted across rules, should its error change
// between attempts. Errors a runner retries before any policy sees them
// (a database's or a broker's, no record's fault) are said in the
// runner's package documentation. A classified otherwise keeps its own
// rules, tried after these. The rules are copied: changing the caller's
// slice afterwards changes nothing.
func Classify(otherwise ErrorPolicy, rules ...ErrorRule) ErrorPolicy {
	otherwise.rules = slices.Concat(rules, otherwise.rules)
	return otherwise
}

// When is the rule that applies p to an error for which errors.Is(err,
// target) holds. A nil target matches nothing, and the runner's
// constructor refuses it.
func When(target error, p ErrorPolicy) ErrorRule {
	if v := reflect.ValueOf(target); target == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		return ErrorRule{name: "When(nil)", policy: p}
	}
	return ErrorRule{match: func(err error) bool { return errors.Is(err, target) }, name: "errors.Is " + target.Error(), policy: p}
}

// WhenAs is the rule that applies p to an error in whose chain errors.As
// finds an E (WhenAs[*net.OpError], WhenAs[interface{ error; Timeout() bool }]).
func WhenAs[E error](p ErrorPolicy) ErrorRule {
	name := "errors.As " + reflect.TypeFor[E]().String()
	return ErrorRule{match: func(err error) bool { _, ok := errors.AsType[E](err); return ok }, name: name, policy: p}
}

// WhenFunc is the rule that applies p to an error for which match reports
// true. match must be quick, must not block, and must be safe for
// concurrent use: it runs once per failure, and offsetstore and dedup
// under Concurrency(n) decide for up to n partitions at once.
func WhenFunc(match func(error) bool, p ErrorPolicy) ErrorRule {
	return ErrorRule{match: match, name: "func", policy: p}
}

// For returns the policy that applies to err: that of p's first rule
// matching err (itself resolved, should it be classified), or p's own
// without its rules; a nil err matches no rule. It is pure and needs no
// broker, so a classification can be tested on its own (see the Classify
// example); the runners call it on every failure of a record.
func (p ErrorPolicy) For(err error) ErrorPolicy {
	for _, r := range p.rules {
		if err != nil && r.match != nil && r.match(err) {
			return r.policy.For(err)
		}
	}
	p.rules = nil
	return p
}

// each calls fn on p's own policy (without rules) and on every policy its
// rules name, depth first, until fn returns false.
func (p ErrorPolicy) each(fn func(ErrorPolicy) bool) bool {
	for _, r := range p.rules {
		if !r.policy.each(fn) {
			return false
		}
	}
	p.rules = nil
	return fn(p)
}

// validateRules checks p's rules, and the policies they name.
func (p ErrorPolicy) validateRules() error {
	for i, r := range p.rules {
		if r.match == nil {
			return errors.New("rule " + strconv.Itoa(i+1) + " of Classify (" + r.name + ") matches nothing: give When a non-nil target error, WhenFunc a function")
		}
		if err := r.policy.Validate(); err != nil {
			return errors.New("rule " + strconv.Itoa(i+1) + " of Classify (" + r.name + "): " + err.Error())
		}
	}
	return nil
}

// rulesString is what String appends for p's rules.
func (p ErrorPolicy) rulesString() string {
	if len(p.rules) == 0 {
		return ""
	}
	parts := make([]string, len(p.rules))
	for i, r := range p.rules {
		parts[i] = r.name + ": " + r.policy.String()
	}
	return "; " + strings.Join(parts, "; ")
}
