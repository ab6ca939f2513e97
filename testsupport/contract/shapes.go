// Package contract holds what every runner's tests check alike, written
// once (as Watermill's pubsub tests are): the shapes of a handler's errors
// that are the record's fault, and the policy that routes them. Each
// runner's test passes its own DeadLetter and runs its own bed; the table
// is one.
package contract

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/eoskit/eoskit"
)

// Shape is an error a handler returns for one record that is the record's
// fault, not the database's or the broker's, however it looks.
type Shape struct {
	Name string
	// Err makes the handler's error for the record at offset.
	Err func(offset int64) error
	// Panics: the handler panics with Err's error rather than returning
	// it; the runner recovers and the policy sees the error wrapped.
	Panics bool
	// Kept is what the dead letter's error text must hold beyond Err's
	// own text (which it holds whole, offset and all).
	Kept []string
}

// Shapes are the handler errors the world makes that a runner must leave
// to the error policy: an enrichment call that cannot connect, a decoder
// on an empty value, a deadline of the handler's own, a panic.
func Shapes() []Shape {
	return []Shape{
		{"net.OpError", func(off int64) error {
			return fmt.Errorf("enrich %d: %w", off, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")})
		}, false, nil},
		{"io.EOF", func(off int64) error { return fmt.Errorf("decode %d: %w", off, io.EOF) }, false, nil},
		{"context.DeadlineExceeded", func(off int64) error { return fmt.Errorf("pricing %d: %w", off, context.DeadlineExceeded) }, false, nil},
		{"panic", func(off int64) error { return fmt.Errorf("decode %d: %w", off, io.EOF) }, true, []string{"handler panicked"}},
	}
}

// Policy routes every Shape to deadLetter (a *net.OpError after three
// attempts, the others at once) and stops on anything else.
func Policy(deadLetter eoskit.ErrorPolicy) eoskit.ErrorPolicy {
	return eoskit.Classify(eoskit.Stop(),
		eoskit.WhenAs[*net.OpError](eoskit.Retry(time.Millisecond, 3).Then(deadLetter)),
		eoskit.When(io.EOF, deadLetter),
		eoskit.When(context.DeadlineExceeded, deadLetter),
	)
}
