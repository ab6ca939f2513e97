package offsetstore

import "github.com/eoskit/eoskit/internal/loop"

// ErrorRule is one rule of [Classify]: a policy and the handler errors it
// applies to.
type ErrorRule struct{ r loop.Rule }

// Classify returns the error policy that chooses by the handler's error,
// as Spring Kafka's error classifier does: the rules are tried in order,
// the first that matches the error gives the policy, and otherwise applies
// to an error none matches. For example
//
//	Classify(Stop(),
//		When(ErrParse, DeadLetter()),
//		WhenAs[*TimeoutError](Retry(100*time.Millisecond, 5)),
//	)
//
// dead-letters a record that cannot be parsed at once, without a retry,
// retries one that timed out, and stops on anything else. The rules
// apply to whatever the policy applies to (an error, a panic); a
// [Runner]'s attempts at a record are counted across rules, should its
// error change between attempts. Errors the runner retries before any
// policy sees them are said in the package documentation.
func Classify(otherwise ErrorPolicy, rules ...ErrorRule) ErrorPolicy {
	rs := make([]loop.Rule, len(rules))
	for i, r := range rules {
		rs[i] = r.r
	}
	return ErrorPolicy{loop.Classify(otherwise.p, rs...)}
}

// When is the rule that applies p to an error for which errors.Is(err,
// target) holds. A nil target matches nothing, and the option that takes
// the policy refuses it.
func When(target error, p ErrorPolicy) ErrorRule { return ErrorRule{loop.Is(target, p.p)} }

// WhenAs is the rule that applies p to an error in whose chain errors.As
// finds an E (WhenAs[*net.OpError], WhenAs[interface{ error; Timeout() bool }]).
func WhenAs[E error](p ErrorPolicy) ErrorRule { return ErrorRule{loop.As[E](p.p)} }

// WhenFunc is the rule that applies p to an error for which match reports
// true. match must be quick and must not block: it runs in the loop,
// once per failure.
func WhenFunc(match func(error) bool, p ErrorPolicy) ErrorRule {
	return ErrorRule{loop.Func(match, p.p)}
}

// For returns the policy that applies to err: that of p's first rule
// matching err, or p's own (a nil err matches no rule). It runs no handler
// and needs no broker, so a classification can be tested on its own (see
// the Classify example); the runner calls it on each failure of a record.
func (p ErrorPolicy) For(err error) ErrorPolicy { return ErrorPolicy{p.p.For(err)} }
