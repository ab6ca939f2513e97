package outbox

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/twmb/franz-go/pkg/kgo"
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

// The relay's dead letter carries its own dead-letter headers only: those
// the record's writer put on it go (issue 47 item 8: on 3bfa998 a
// record's eoskit-outbox-topic came after the relay's, and its
// eoskit-outbox-value blocked the replay).
func TestAnOutboxDeadLetterDropsTheRecordsOwnDeadLetterHeaders(t *testing.T) {
	c := &config{deadLetter: "dlq"}
	rw := row{id: 12, partition: -1, rec: &kgo.Record{Topic: "orders", Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: "region", Value: []byte("south")},
		{Key: "eoskit-outbox-topic", Value: []byte("payments")},
		{Key: "eoskit-outbox-value", Value: []byte("blocked")},
	}}}
	out := c.record(rw, map[int64]error{12: errors.New("refused")})
	got := map[string][]string{}
	for _, h := range out.Headers {
		got[h.Key] = append(got[h.Key], string(h.Value))
	}
	if fmt.Sprint(got["eoskit-outbox-topic"]) != "[orders]" || got["eoskit-outbox-value"] != nil || fmt.Sprint(got["region"]) != "[south]" {
		t.Fatalf("dead letter headers %v: want eoskit-outbox-topic [orders] alone, no eoskit-outbox-value, the record's region kept", got)
	}
}
