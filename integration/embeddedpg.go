package integration

import (
	"errors"
	"testing"
)

// errNoEmbeddedPostgres says why [PostgresServer] found no embedded server.
var errNoEmbeddedPostgres = errors.New("no embedded PostgreSQL is built into this version of the kit")

// startEmbeddedPostgres is the last place [PostgresServer] looks, after
// DATABASE_URL and Docker: a PostgreSQL server run from downloaded
// binaries in a temporary folder, stopped and deleted when tb ends, so
// that a user's database tests run with no Docker. It returns the URL of
// a role that may create databases, or an error saying why there is none
// (offline, another OS): [PostgresServer] then skips or fails tb.
func startEmbeddedPostgres(tb testing.TB) (string, error) {
	tb.Helper()
	return "", errNoEmbeddedPostgres
}
