package outbox

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// The replication connection does not inherit the pool's context watcher:
// with pgconn's CancelRequestContextWatcherHandler, each read deadline of
// the stream would send a cancel request to the walsender. It gets
// pgconn's default, a deadline on the socket (issue 43 item 19, failing
// on 3bfa998: the pool's handler was kept).
func TestTheReplicationConnectionKeepsNoCancelRequestWatcher(t *testing.T) {
	pool, err := pgconn.ParseConfig("postgres://u@127.0.0.1:5432/db")
	if err != nil {
		t.Fatal(err)
	}
	pool.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc}
	}
	repl := replicationConfig(pool)
	if h := repl.BuildContextWatcherHandler(&pgconn.PgConn{}); h == nil {
		t.Fatal("no context watcher for the replication connection")
	} else if _, ok := h.(*pgconn.DeadlineContextWatcherHandler); !ok {
		t.Fatalf("the replication connection's context watcher is %T, want pgconn's deadline handler", h)
	}
	if repl.RuntimeParams["replication"] != "database" {
		t.Fatalf("replication = %q", repl.RuntimeParams["replication"])
	}
	if _, ok := pool.BuildContextWatcherHandler(&pgconn.PgConn{}).(*pgconn.CancelRequestContextWatcherHandler); !ok {
		t.Fatal("the pool's own config was changed")
	}
}
