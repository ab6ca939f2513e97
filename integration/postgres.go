package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/eostest"
)

// DatabaseURLEnv names the environment variable with the URL of a running
// PostgreSQL whose role may create databases.
const DatabaseURLEnv = eostest.DatabaseURLEnv

const postgresHowTo = "Run `make test` (it starts PostgreSQL with scripts/postgres.sh), " +
	"or run `scripts/postgres.sh start` and export the DATABASE_URL it prints, " +
	"or start Docker (eostest runs a container then)."

// Postgres returns a pool on a fresh database created for this test and
// dropped when it ends, on the server named by DATABASE_URL or else a
// PostgreSQL container started for tb ([eostest.Postgres]). It skips (or, with EOS_REQUIRE_SERVICES=1,
// fails) tb when neither is available.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, _ := PostgresWithURL(tb)
	return pool
}

// PostgresWithURL is [Postgres] that also returns the new database's URL,
// for code under test that opens its own connections.
func PostgresWithURL(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	serverURL := eostest.Postgres(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	admin, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		missingService(tb, "PostgreSQL", postgresHowTo, err)
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

// databaseURL swaps the database name in a postgres:// URL.
func databaseURL(serverURL, database string) string {
	rest, query, _ := strings.Cut(serverURL, "?")
	if i := strings.LastIndex(rest, "/"); i > len("postgres://") {
		rest = rest[:i]
	}
	u := rest + "/" + database
	if query != "" {
		u += "?" + query
	}
	return u
}
