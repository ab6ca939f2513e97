package loop

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

var errParse = errors.New("parse")

// A handler that panics with an error is classified by that error, as one
// that returned it would be.
func TestRecoverKeepsAPanickingErrorForTheRules(t *testing.T) {
	err := Recover("eos", func() error { panic(fmt.Errorf("report 7: %w", errParse)) })
	if !errors.Is(err, errParse) || !strings.Contains(err.Error(), "handler panicked") {
		t.Fatalf("Recover = %v, want a panic wrapping errParse", err)
	}
	if err := Recover("eos", func() error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Recover of a string panic = %v", err)
	}
}
