package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/eoskit/eoskit/dedup"
)

// ErrParse is what this application's handler wraps when a record cannot
// be parsed.
var ErrParse = errors.New("cannot parse")

// A policy that dead-letters a record that cannot be parsed at once,
// retries a timeout, and stops on anything else. For tells which policy
// applies to an error, without a broker: a test of the classification.
// Give it to dedup.OnHandlerError.
func ExampleClassify() {
	policy := dedup.Classify(dedup.Stop(),
		dedup.When(ErrParse, dedup.DeadLetter()),
		dedup.When(context.DeadlineExceeded, dedup.Retry(100*time.Millisecond, 5)),
		dedup.WhenAs[*net.OpError](dedup.Retry(time.Second, 3).Then(dedup.DeadLetter())),
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
	// order 17: cannot parse: dead-letter
	// pricing: context deadline exceeded: retry from 100ms, 5 attempts, then stop
	// stock: dial: connection refused: retry from 1s, 3 attempts, then dead-letter
	// disk full: stop
}
