package eoskit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/eoskit/eoskit"

	"github.com/eoskit/eoskit/eos"
)

// ErrParse is what this application's handler wraps when a record cannot
// be parsed.
var ErrParse = errors.New("cannot parse")

// A policy that dead-letters a record that cannot be parsed at once,
// retries a timeout, and stops on anything else. For tells which policy
// applies to an error, without a broker: a test of the classification.
// Give it to eos.OnHandlerError; offsetstore and dedup take the same
// policy with their own DeadLetter() (a table, not a topic).
func ExampleClassify() {
	policy := eoskit.Classify(eoskit.Stop(),
		eoskit.When(ErrParse, eos.DeadLetter("orders-dlq")),
		eoskit.When(context.DeadlineExceeded, eoskit.Retry(100*time.Millisecond, 5)),
		eoskit.WhenAs[*net.OpError](eoskit.Retry(time.Second, 3).Then(eos.DeadLetter("orders-dlq"))),
	)
	for _, err := range []error{
		fmt.Errorf("order 17: %w", ErrParse),
		fmt.Errorf("pricing: %w", context.DeadlineExceeded),
		fmt.Errorf("stock: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}),
		errors.New("disk full"),
	} {
		fmt.Printf("%s: %s\n", err, policy.For(err))
	}
	// Output:
	// order 17: cannot parse: dead-letter to orders-dlq
	// pricing: context deadline exceeded: retry from 100ms, 5 attempts, then stop
	// stock: dial: connection refused: retry from 1s, 3 attempts, then dead-letter to orders-dlq
	// disk full: stop
}
