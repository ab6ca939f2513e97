// Package pgretry tells a database that went away from a statement that
// failed, for the loops that must retry the first and stop on the second.
package pgretry

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Transient reports whether err looks like the database going away or
// pushing back rather than a statement being refused: connection errors,
// server shutdown or termination (a restart, pg_terminate_backend),
// serialization failures, deadlocks, lock waits that timed out (55P03),
// exhausted resources, or a server that does not answer a ping.
func Transient(ctx context.Context, pool *pgxpool.Pool, err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P") || code == "40001" || code == "40P01" || code == "55P03" || strings.HasPrefix(code, "53")
	}
	var netErr net.Error
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.As(err, &netErr) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return true
	}
	pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return pool.Ping(pingCtx) != nil
}
