package pgretry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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

// A handler's error is the database's only by the database's own signals:
// its SQLSTATE, or an error pgconn made. A *net.OpError from an enrichment
// call, io.EOF from a decoder, context.DeadlineExceeded from a deadline of
// the handler's own are the record's, for the error policy (they were
// taken for the database's, and the batch retried 10 times, then Run
// failed: issue 43 item 10). statement_timeout's 57014 is a wait, not the
// record's fault (item 11).
func TestFromHandlerReadsOnlyTheDatabasesSignals(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code} }
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"statement_timeout (57014)":     {fmt.Errorf("update: %w", pg("57014")), true},
		"serialization failure":         {pg("40001"), true},
		"deadlock":                      {pg("40P01"), true},
		"lock timeout":                  {pg("55P03"), true},
		"admin shutdown":                {pg("57P01"), true},
		"connection failure class 08":   {pg("08006"), true},
		"unique violation":              {pg("23505"), false},
		"check violation":               {pg("23514"), false},
		"enrichment call: *net.OpError": {fmt.Errorf("enrich k1: %w", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}), false},
		"decoder: io.EOF":               {fmt.Errorf("decode: %w", io.EOF), false},
		"decoder: io.ErrUnexpectedEOF":  {fmt.Errorf("decode: %w", io.ErrUnexpectedEOF), false},
		"the handler's deadline":        {fmt.Errorf("pricing: %w", context.DeadlineExceeded), false},
		"a handler's own error":         {errors.New("rejected"), false},
		"conn busy":                     {fmt.Errorf("insert: %w", busyErr{}), false},
		"nil":                           {nil, false},
	} {
		if got := FromHandler(c.err); got != c.want {
			t.Errorf("%s: FromHandler(%v) = %v, want %v", name, c.err, got, c.want)
		}
	}
	// A pool of the handler's own that cannot connect (nothing listens on
	// port 1): the handler's dependency, not the runner's database, whose
	// connection the transaction already holds.
	_, cerr := pgconn.Connect(context.Background(), "postgres://u@127.0.0.1:1/db?connect_timeout=2")
	if _, ok := errors.AsType[*pgconn.ConnectError](cerr); !ok || FromHandler(fmt.Errorf("lookup: %w", cerr)) {
		t.Errorf("FromHandler(a failed connect of another pool: %v) = true, want false", cerr)
	}
	// A CopyFrom pgx cancelled because a row failed to encode: 57014 with
	// COPY's message, the row's fault.
	if FromHandler(&pgconn.PgError{Code: "57014", Message: "COPY from stdin failed: encode row 7"}) {
		t.Error("FromHandler(a COPY a row failed) = true, want false")
	}
	if !Transient(pg("57014")) {
		t.Error("Transient(57014) = false: a cancelled statement is a wait")
	}
}

// A setting the server refuses (its certificate not trusted or not for the
// host, a password, a role, a database) is no outage: Refused names it and
// Transient does not retry it; a server going away is still transient.
func TestRefusedSettingsAreNotRetried(t *testing.T) {
	for _, c := range []struct {
		name    string
		err     error
		refused bool
	}{
		{"unknown CA", fmt.Errorf("failed to connect: %w", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}), true},
		{"another host's certificate", fmt.Errorf("failed to connect: %w", x509.HostnameError{Certificate: &x509.Certificate{}, Host: "db"}), true},
		{"a wrong password", &pgconn.PgError{Code: "28P01"}, true},
		{"no pg_hba entry", &pgconn.PgError{Code: "28000"}, true},
		{"no such database", &pgconn.PgError{Code: "3D000"}, true},
		{"the server shutting down", &pgconn.PgError{Code: "57P01"}, false},
		{"a refused TCP connection", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, false},
	} {
		if got := Refused(c.err) != ""; got != c.refused {
			t.Errorf("%s: Refused = %q, want refused %v", c.name, Refused(c.err), c.refused)
		}
		if c.refused && Transient(c.err) {
			t.Errorf("%s: Transient, want a setting no retry cures", c.name)
		}
	}
}
