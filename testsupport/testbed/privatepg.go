package testbed

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/freeport"
	"github.com/eoskit/eoskit/testsupport/srctree"
)

const privatePostgresHowTo = "A private PostgreSQL needs the machine's PostgreSQL binaries (initdb, pg_ctl), " +
	"is started from the eoskit source tree with scripts/postgres.sh, and runs under `make test` (or with DATABASE_URL set)."

// PrivatePostgres is a PostgreSQL server of the test's own
// (scripts/postgres.sh private-start: initdb in a temporary folder,
// wal_level=logical), for tests that restart the database under a running
// service. It is stopped and its data deleted when the test ends, or, if
// the test binary dies first, by a watchdog.
type PrivatePostgres struct {
	// URL connects to its postgres database as a superuser.
	URL      string
	script   string
	stateDir string
}

// StartPrivatePostgres starts a private server and returns it once it
// accepts connections. It runs where the shared PostgreSQL of `make test`
// does (the machine's PostgreSQL binaries); it skips or fails tb like
// [integration.Postgres] when it can not.
func StartPrivatePostgres(tb testing.TB) *PrivatePostgres {
	tb.Helper()
	return startPrivatePostgres(tb)
}

// StartPrivatePostgresWithTLS is [StartPrivatePostgres] taking TCP
// connections, replication included, over TLS only, with a certificate for
// 127.0.0.1 and localhost signed by a CA of its own ([PrivatePostgres.CAFile]);
// its URL trusts that CA alone and checks the host name
// (sslmode=verify-full).
func StartPrivatePostgresWithTLS(tb testing.TB) *PrivatePostgres {
	tb.Helper()
	return startPrivatePostgres(tb, "--tls")
}

func startPrivatePostgres(tb testing.TB, flags ...string) *PrivatePostgres {
	tb.Helper()
	if os.Getenv(integration.DatabaseURLEnv) == "" && !integration.ServicesRequired() {
		integration.ServiceMissing(tb, "a private PostgreSQL", privatePostgresHowTo,
			fmt.Errorf("no services configured (%s and %s are unset)", integration.DatabaseURLEnv, integration.RequireServicesEnv))
	}
	script, err := srctree.Find("scripts/postgres.sh")
	if err != nil {
		integration.ServiceMissing(tb, "a private PostgreSQL", privatePostgresHowTo, err)
	}
	ports, err := freeport.Ports(1)
	if err != nil {
		tb.Fatalf("testbed: %v", err)
	}
	p := &PrivatePostgres{script: script, stateDir: tb.TempDir()}
	tb.Cleanup(func() {
		if _, err := runScript(context.Background(), p.script, p.stateDir, "private-stop"); err != nil {
			tb.Logf("testbed: stop private PostgreSQL: %v", err)
		}
	})
	out, err := runScript(context.Background(), script, p.stateDir, append([]string{"private-start", strconv.Itoa(ports[0])}, flags...)...)
	if err != nil {
		tb.Fatalf("testbed: start a private PostgreSQL: %v", err)
	}
	url, ok := strings.CutPrefix(strings.TrimSpace(lastLine(out)), integration.DatabaseURLEnv+"=")
	if !ok {
		tb.Fatalf("testbed: postgres.sh private-start printed no %s line: %q", integration.DatabaseURLEnv, out)
	}
	p.URL = url
	return p
}

// Pool returns a pool on the server's postgres database, closed when the
// test ends.
func (p *PrivatePostgres) Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, p.URL)
	if err != nil {
		tb.Fatalf("testbed: connect to the private PostgreSQL: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Restart restarts the server and returns once it accepts connections
// again. With hard, it shuts down in immediate mode: every backend is
// killed and the server recovers from its log, as after a crash.
func (p *PrivatePostgres) Restart(ctx context.Context, hard bool) error {
	args := []string{"private-restart"}
	if hard {
		args = append(args, "--hard")
	}
	_, err := runScript(ctx, p.script, p.stateDir, args...)
	return err
}

// Snapshot copies the server's data folder under name after a clean
// shutdown, and starts the server again: what a volume snapshot or a
// base backup holds.
func (p *PrivatePostgres) Snapshot(ctx context.Context, name string) error {
	_, err := runScript(ctx, p.script, p.stateDir, "private-snapshot", name)
	return err
}

// Restore kills the server, puts the data folder Snapshot copied under
// name back, and starts it: the database, its log and its replication
// slots as they were then.
func (p *PrivatePostgres) Restore(ctx context.Context, name string) error {
	_, err := runScript(ctx, p.script, p.stateDir, "private-restore", name)
	return err
}

// Log returns the path of the server's log.
func (p *PrivatePostgres) Log() string {
	b, _ := os.ReadFile(filepath.Join(p.stateDir, "postgres", "pgdata"))
	return filepath.Join(strings.TrimSpace(string(b)), "log")
}

// CAFile is the CA certificate (PEM) a server of
// [StartPrivatePostgresWithTLS] is signed by.
func (p *PrivatePostgres) CAFile() string {
	b, _ := os.ReadFile(filepath.Join(p.stateDir, "postgres", "pgdata"))
	return filepath.Join(strings.TrimSpace(string(b)), "tls", "ca.pem")
}

// Database creates a database of the test's own on the server and returns
// a pool on it, closed when the test ends, and its URL.
func (p *PrivatePostgres) Database(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := strings.ToLower(strings.NewReplacer("/", "_", "-", "_", " ", "_").Replace(integration.UniqueName(tb, "db")))
	if len(name) > 63 {
		name = name[:30] + name[len(name)-33:]
	}
	if _, err := p.Pool(tb).Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("testbed: create database %s: %v", name, err)
	}
	u, err := url.Parse(p.URL)
	if err != nil {
		tb.Fatalf("testbed: %v", err)
	}
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		tb.Fatalf("testbed: connect to %s: %v", name, err)
	}
	tb.Cleanup(pool.Close)
	return pool, u.String()
}
