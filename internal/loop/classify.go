package loop

import (
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Rule is one rule of a classified policy: when Match reports true for a
// handler's error, Policy applies to the record instead of the policy's
// own.
type Rule struct {
	Match func(error) bool
	// Name says what Match looks for, for String and for the error that
	// refuses a rule without Match.
	Name   string
	Policy Policy
}

// Is is the Rule that applies p to errors for which errors.Is(err,
// target) holds.
func Is(target error, p Policy) Rule {
	if target == nil {
		return Rule{Name: "When(nil)", Policy: p}
	}
	return Rule{Match: func(err error) bool { return errors.Is(err, target) }, Name: "errors.Is " + target.Error(), Policy: p}
}

// As is the Rule that applies p to errors for which errors.As finds an E
// in the chain.
func As[E error](p Policy) Rule {
	name := "errors.As " + reflect.TypeFor[E]().String()
	return Rule{Match: func(err error) bool { _, ok := errors.AsType[E](err); return ok }, Name: name, Policy: p}
}

// Func is the Rule that applies p to errors for which match reports true.
func Func(match func(error) bool, p Policy) Rule {
	return Rule{Match: match, Name: "func", Policy: p}
}

// Classify returns otherwise with rules put before its own (if it is
// classified already): [Policy.For] tries them in order, and otherwise's
// own policy applies to an error none matches.
func Classify(otherwise Policy, rules ...Rule) Policy {
	otherwise.Rules = append(slices.Clip(rules), otherwise.Rules...)
	return otherwise
}

// For is the policy that applies to err: the policy of the first rule
// whose Match reports true (itself resolved, should it be classified), or
// p's own without its rules; a nil err matches no rule. It is pure: a
// user can test a classification with it, and the runners call it on
// every failure of a record, so a record whose error changes between
// attempts follows each error's policy (its attempts are counted across
// them).
func (p Policy) For(err error) Policy {
	for _, r := range p.Rules {
		if err != nil && r.Match != nil && r.Match(err) {
			return r.Policy.For(err)
		}
	}
	p.Rules = nil
	return p
}

// each calls fn on p's own policy (without rules) and on every policy its
// rules name, depth first, until fn returns false.
func (p Policy) each(fn func(Policy) bool) bool {
	for _, r := range p.Rules {
		if !r.Policy.each(fn) {
			return false
		}
	}
	p.Rules = nil
	return fn(p)
}

// validateRules checks p's rules, and the policies they name.
func (p Policy) validateRules() error {
	for i, r := range p.Rules {
		if r.Match == nil {
			return errors.New("rule " + strconv.Itoa(i+1) + " of Classify (" + r.Name + ") matches nothing: give When a non-nil target error, WhenFunc a function")
		}
		if err := r.Policy.Validate(); err != nil {
			return errors.New("rule " + strconv.Itoa(i+1) + " of Classify (" + r.Name + "): " + err.Error())
		}
	}
	return nil
}

// rulesString is what String appends for p's rules.
func (p Policy) rulesString() string {
	if len(p.Rules) == 0 {
		return ""
	}
	parts := make([]string, len(p.Rules))
	for i, r := range p.Rules {
		parts[i] = r.Name + ": " + r.Policy.String()
	}
	return "; " + strings.Join(parts, "; ")
}
