// Package pgretry tells a database that went away, or pushed back, from a
// statement that failed, for the loops that must retry the first and stop
// on the second.
package pgretry

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Transient reports, from err alone, whether it looks like the database
// going away or pushing back rather than a statement being refused:
// connection errors, server shutdown or termination (a restart,
// pg_terminate_backend), serialization failures, deadlocks, lock waits
// that timed out, exhausted resources, or a network error or timeout on
// the way. It takes no connection: a runner asking it with every
// connection of its pool in use gets its answer at once.
func Transient(err error) bool {
	if err == nil || Refused(err) != "" {
		return false
	}
	if errors.As(err, new(*pgconn.PgError)) {
		return TransientCode(err)
	}
	if connBusy(err) {
		return false
	}
	var netErr net.Error
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.As(err, &netErr) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

// FromHandler is [Transient] for an error a handler returned: it reads
// only the database's own word, a PostgreSQL error code
// ([TransientCode]). It never reads the error's shape: a *net.OpError,
// io.EOF, context.DeadlineExceeded, or an error pgconn made (a deadline of
// the handler's own used up before a statement was sent, a pool of the
// handler's own that cannot connect) is what a handler's own calls return
// too, and such a failure is the record's, for the error policy to
// decide. A connection of the runner's that broke under the handler is
// told by the caller from the connection itself: pgconn closes it on any
// failed read or write, so it is closed, or fails its next round trip (the
// rollback to the savepoint, [TransientOn]'s ping).
func FromHandler(err error) bool {
	return err != nil && !connBusy(err) && TransientCode(err)
}

// TransientCode is [Transient] for the database's own word alone: a
// PostgreSQL error whose code says the connection, the server or a
// conflict with another transaction failed the statement, not its input;
// or that it was cancelled (57014: statement_timeout, pg_cancel_backend),
// which is a wait, like a lock wait that timed out.
func TransientCode(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	code := pgErr.Code
	if code == "57014" && strings.HasPrefix(pgErr.Message, "COPY from stdin failed") {
		// pgx cancels a CopyFrom whose rows fail to encode (or whose
		// CopyFromSource fails) and PostgreSQL reports 57014: a row's
		// fault, not a wait.
		return false
	}
	return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P") || strings.HasPrefix(code, "53") ||
		code == "40001" || code == "40P01" || code == "55P03" || code == "57014"
}

// pingTimeout bounds the ping of [TransientOn].
const pingTimeout = 2 * time.Second

// TransientOn is [FromHandler] for err returned by work done on conn, a
// handler's error inside the transaction conn holds, whose text may hide
// the database's error (wrapped with %v, or replaced): it also reports
// true when conn is closed, or does not answer a ping within 2 s. The
// ping goes over conn itself (it works in an aborted transaction), never
// over another connection of the pool, which may never come free while
// the transaction holds this one.
func TransientOn(ctx context.Context, conn *pgx.Conn, err error) bool {
	if FromHandler(err) {
		return true
	}
	if conn == nil || conn.IsClosed() {
		return true
	}
	pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	err = conn.Ping(pingCtx)
	return err != nil && !connBusy(err)
}

// connBusy reports pgx's "conn busy": the connection is alive, held by
// rows the handler left open. pgx calls it safe to retry (nothing was
// sent), but it is the handler's own error, not the database's.
func connBusy(err error) bool { return strings.Contains(err.Error(), "conn busy") }
