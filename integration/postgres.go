package integration

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresServer returns the URL of a real PostgreSQL server for tb, as a
// role that may create databases, from the first of: DATABASE_URL; a
// container started for tb and terminated when it ends (role eoskit, a
// random password in the URL); an embedded PostgreSQL server, where the kit carries one. With
// none it skips tb, or fails it with EOS_REQUIRE_SERVICES=1. A container
// that Docker runs but that does not come up fails tb. Without
// DATABASE_URL each call starts a server of its own (a container or an
// embedded server, for tb alone); set DATABASE_URL to share one. Tests
// that write data use [Postgres], which gives each its own database.
func PostgresServer(tb testing.TB) string {
	tb.Helper()
	if s := os.Getenv(DatabaseURLEnv); s != "" {
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	p, err := RunPostgres(ctx, testLogger(tb))
	if err == nil {
		tb.Cleanup(func() { terminate(tb, "postgres", p.Terminate) })
		return p.URL()
	}
	if !errors.Is(err, ErrNoDocker) {
		tb.Fatalf("integration: PostgreSQL container: %v", err)
	}
	url, embeddedErr := startEmbeddedPostgres(tb)
	if embeddedErr != nil {
		ServiceMissing(tb, "PostgreSQL", postgresHowTo, fmt.Errorf("%s is unset, %w, and %w", DatabaseURLEnv, err, embeddedErr))
	}
	return url
}

// Postgres returns a pool on a fresh database created for tb and dropped
// (WITH (FORCE)) when it ends, on the server [PostgresServer] finds, and
// closed when tb ends. It skips or fails like [PostgresServer].
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, _ := PostgresWithURL(tb)
	return pool
}

// PostgresWithURL is [Postgres] that also returns the new database's URL,
// for code under test that opens its own connections.
func PostgresWithURL(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	serverURL := PostgresServer(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		if os.Getenv(DatabaseURLEnv) != "" {
			// Named, and wrong (a password, a host): not a service
			// missing, and no skip.
			tb.Fatalf("integration: connect to %s: %v", DatabaseURLEnv, err)
		}
		ServiceMissing(tb, "PostgreSQL", postgresHowTo, err)
	}
	defer admin.Close(ctx)

	name := strings.ToLower(unsafeIdentChars.ReplaceAllString(UniqueName(tb, "eoskit"), "_"))
	if len(name) > 63 { // PostgreSQL truncates identifiers to 63 bytes.
		name = name[:30] + name[len(name)-33:]
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("integration: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			tb.Logf("integration: drop database %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Logf("integration: drop database %s: %v", name, err)
		}
	})

	cfg, err := pgxpool.ParseConfig(serverURL)
	if err != nil {
		tb.Fatalf("integration: parse %s: %v", DatabaseURLEnv, err)
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("integration: connect to %s: %v", name, err)
	}
	tb.Cleanup(pool.Close)
	return pool, databaseURL(serverURL, name)
}

// databaseURL is serverURL naming database instead of its own: in a URL's
// path (and without a dbname parameter, which would override it), or as a
// last dbname= of a keyword/value string, where the last key wins.
func databaseURL(serverURL, database string) string {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return serverURL + " dbname=" + database
	}
	u.Path, u.RawPath = "/"+database, ""
	q := u.Query()
	q.Del("dbname")
	u.RawQuery = q.Encode()
	return u.String()
}
