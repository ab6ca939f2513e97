package offsetstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/eoskit/eoskit/offsetstore"
)

// ErrParse is what this application's handler wraps when a record cannot
// be parsed.
var ErrParse = errors.New("cannot parse")

// A policy that dead-letters a record that cannot be parsed at once,
// retries a timeout, and stops on anything else. For tells which policy
// applies to an error, without a broker: a test of the classification.
// Give it to offsetstore.OnHandlerError.
func ExampleClassify() {
	policy := offsetstore.Classify(offsetstore.Stop(),
		offsetstore.When(ErrParse, offsetstore.DeadLetter()),
		offsetstore.When(context.DeadlineExceeded, offsetstore.Retry(100*time.Millisecond, 5)),
		offsetstore.WhenAs[*net.OpError](offsetstore.Retry(time.Second, 3).Then(offsetstore.DeadLetter())),
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
