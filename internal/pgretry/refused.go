package pgretry

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/tlsfault"
)

// Refused says which connection setting err shows wrong, "" when err says
// nothing of the settings: the server's certificate not trusted or not for
// the host dialed, a password or a role the server refuses, a database
// that does not exist. No retry cures these: a runner reports them at once
// rather than ride them out as an outage.
func Refused(err error) string {
	if err == nil {
		return ""
	}
	switch tlsfault.Of(err) {
	case tlsfault.UnknownCA:
		return "the server's certificate is signed by a CA the pool does not trust (sslrootcert)"
	case tlsfault.WrongHost:
		return "the server's certificate is not for the host dialed (sslmode=verify-full checks it)"
	case tlsfault.Refused:
		return "the server's certificate does not verify"
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01":
			return "the server refused the password"
		case "28000":
			return "the server refused the connection (pg_hba.conf has no entry for it, or the role may not log in)"
		case "3D000":
			return "the database does not exist"
		}
	}
	return ""
}

// checkTimeout bounds CheckPool's connection.
const checkTimeout = 10 * time.Second

// recheck is how long CheckPool waits before it asks again after a
// refusal.
const recheck = 2 * time.Second

// CheckPool connects through pool and returns a *eoskit.ConfigError of
// pkg naming the pool when the server refuses a setting (see [Refused])
// twice, a few seconds apart (a pooler or proxy restarting before its
// credentials are loaded, a password being rotated, refuses once); nil
// when it connects, or fails for a reason a retry may cure (the server
// down or restarting: the runner rides that out).
func CheckPool(ctx context.Context, pkg string, pool *pgxpool.Pool) error {
	refused := func() (string, error) {
		ctx, cancel := context.WithTimeout(ctx, checkTimeout)
		defer cancel()
		conn, err := pool.Acquire(ctx)
		if err == nil {
			conn.Release()
			return "", nil
		}
		return Refused(err), err
	}
	if reason, _ := refused(); reason == "" {
		return nil
	}
	if !loop.Sleep(ctx, recheck) {
		return nil
	}
	reason, err := refused()
	if reason == "" {
		return nil
	}
	return &eoskit.ConfigError{Package: pkg, Setting: "pool", Reason: reason + ": " + err.Error(), Err: err}
}
