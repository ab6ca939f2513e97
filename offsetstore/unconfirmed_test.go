package offsetstore_test

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/offsetstore"
)

// commitCutter is a pgx dialer whose connections close right after
// sending the armed COMMIT: the server commits, and the client never hears
// it, as when a network drops the answer.
type commitCutter struct {
	commitsBefore int32 // COMMITs let through before the cut one
	seen          atomic.Int32
	cut           atomic.Bool
}

func (d *commitCutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: c, d: d}, nil
}

type cutConn struct {
	net.Conn
	d *commitCutter
}

func (c *cutConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	// pgx sends COMMIT as a simple query: 'Q', its length, "commit\x00".
	if err == nil && len(p) > 5 && p[0] == 'Q' && bytes.EqualFold(bytes.TrimRight(p[5:], "\x00"), []byte("commit")) &&
		c.d.seen.Add(1) == c.d.commitsBefore+1 && c.d.cut.CompareAndSwap(false, true) {
		c.Conn.Close()
	}
	return n, err
}

// A batch whose COMMIT the database carried out but never answered: the
// runner cannot know it committed, and retries it. The retry must find the
// batch committed, from the database's own record of the transaction, and
// go on: every record applied once, and no commit counted as refused
// (StaleRejected) nor logged as a zombie's. Before, the retry found the
// offsets rows moved (by its own commit), counted a stale owner and
// rewound as a zombie (issue 43 item 16, failing on 411f3b1).
func TestAnUnconfirmedCommitIsNotTakenForAZombie(t *testing.T) {
	t.Parallel()
	const n = 2000
	b := newBed(t, 2, n)
	cutter := &commitCutter{commitsBefore: 3}
	cfg, err := pgxpool.ParseConfig(b.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = cutter.dial
	b.runnerPoolWith(t, cfg)
	run := b.start(t, load(nil), offsetstore.MaxRecordsPerCommit(100))
	waitFor(t, time.Minute, "every record applied", func() bool { return b.rows(t) >= n })
	run.stop(t)
	if !cutter.cut.Load() {
		t.Fatal("no COMMIT was cut: the fault never struck")
	}
	t.Logf("verifier: %v", b.verify(t))
	if s := run.r.Stats(); s.StaleRejected != 0 {
		t.Fatalf("a commit whose answer was lost was counted as refused to a stale owner %d times: %+v", s.StaleRejected, s)
	}
}
