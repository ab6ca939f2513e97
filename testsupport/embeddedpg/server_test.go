package embeddedpg_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eoskit/eoskit/testsupport/embeddedpg"
)

// start starts a server for t, failing (not skipping) under
// EOS_REQUIRE_SERVICES=1 when the binaries cannot be had.
func start(t *testing.T) *embeddedpg.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := embeddedpg.Start(ctx, embeddedpg.Options{Progress: func(s string) { t.Log(s) }})
	if errors.Is(err, embeddedpg.ErrUnavailable) && os.Getenv("EOS_REQUIRE_SERVICES") != "1" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// The server is what the database patterns need (a superuser with
// REPLICATION, wal_level=logical, pgoutput for a logical slot), and Stop
// leaves neither a server nor its directory behind.
func TestServerServesTheOutboxAndLeavesNothing(t *testing.T) {
	srv := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	var level string
	var super, repl bool
	if err := conn.QueryRow(ctx, `SELECT current_setting('wal_level'), rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user`).Scan(&level, &super, &repl); err != nil {
		t.Fatal(err)
	}
	if level != "logical" || !super || !repl {
		t.Errorf("wal_level %s, superuser %v, replication %v; want logical, true, true", level, super, repl)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot('embeddedpg_test', 'pgoutput')`); err != nil {
		t.Errorf("a pgoutput slot: %v", err)
	}
	_ = conn.Close(ctx)

	dir := embeddedpg.Dir(srv)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the cluster's directory %s after Stop: %v; want it gone", dir, err)
	}
	if _, err := pgx.Connect(ctx, srv.URL()); err == nil {
		t.Error("the server still accepts connections after Stop")
	}
}
