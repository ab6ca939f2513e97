package pgretry

import (
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Transient tells the database going away or pushing back from a
// statement refused, from the error alone, through wrapping.
func TestTransientFromTheErrorAlone(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code} }
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"lock timeout":            {pg("55P03"), true},
		"serialization failure":   {pg("40001"), true},
		"deadlock":                {pg("40P01"), true},
		"connection failure":      {pg("08006"), true},
		"admin shutdown":          {pg("57P01"), true},
		"too many connections":    {pg("53300"), true},
		"wrapped lock timeout":    {fmt.Errorf("update accounts: %w", pg("55P03")), true},
		"network error":           {&net.OpError{Op: "read", Err: errors.New("connection reset")}, true},
		"unexpected EOF":          {fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		"unique violation":        {pg("23505"), false},
		"undefined table":         {pg("42P01"), false},
		"a handler's own error":   {errors.New("rejected m2"), false},
		"a wrapped handler error": {fmt.Errorf("payment: %w", errors.New("declined")), false},
		"nil":                     {nil, false},
		"conn busy (rows left open by the handler)": {fmt.Errorf("insert: %w", busyErr{}), false},
	} {
		if got := Transient(c.err); got != c.want {
			t.Errorf("%s: Transient(%v) = %v, want %v", name, c.err, got, c.want)
		}
	}
}

// busyErr is what pgx returns for a statement on a connection whose rows
// are still open: safe to retry by pgx's account, nothing having been sent.
type busyErr struct{}

func (busyErr) Error() string     { return "conn busy" }
func (busyErr) SafeToRetry() bool { return true }
