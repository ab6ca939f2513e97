package contract

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// CommitCutter is a pgx dialer whose connections close right after sending
// one COMMIT, the CommitsBefore+1st: the server commits, and the client
// never hears it, as when a network drops the answer.
type CommitCutter struct {
	CommitsBefore int32
	seen          atomic.Int32
	cut           atomic.Bool
}

// Dial is the pgx DialFunc.
func (d *CommitCutter) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: c, d: d}, nil
}

// Cut reports whether a COMMIT was cut.
func (d *CommitCutter) Cut() bool { return d.cut.Load() }

type cutConn struct {
	net.Conn
	d *CommitCutter
}

func (c *cutConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	// pgx sends COMMIT as a simple query: 'Q', its length, "commit\x00".
	if err == nil && len(p) > 5 && p[0] == 'Q' && bytes.EqualFold(bytes.TrimRight(p[5:], "\x00"), []byte("commit")) &&
		c.d.seen.Add(1) == c.d.CommitsBefore+1 && c.d.cut.CompareAndSwap(false, true) {
		_ = c.Conn.Close()
	}
	return n, err
}

// PoolWith returns a pool on url whose connections dial through dial,
// closed when the test ends.
func PoolWith(t *testing.T, url string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = dial
	// Plaintext, so that a dialer (CommitCutter) can read the protocol:
	// a server that requires TLS then refuses, and the test says so.
	cfg.ConnConfig.TLSConfig, cfg.ConnConfig.Fallbacks = nil, nil
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// unconfirmed: a batch's COMMIT that the database carried out but whose
// answer was lost is retried (offsetstore finds the batch committed from
// the database's record of the transaction, dedup from its claims) and
// the runner goes on. Every effect is committed once, Run goes on without
// an error, and the runner is Healthy again. That the retry took the
// committed path, not a second apply, is each runner's own test
// (offsetstore's TestAnUnconfirmedCommitIsNotTakenForAZombie reads its
// Stats).
func unconfirmed(t *testing.T, s Subject) {
	if !s.Features.Database {
		t.Skip("the runner commits no database transaction")
	}
	w := s.New(t)
	ids := w.Seed(t, 600)
	cutter := &CommitCutter{CommitsBefore: 3}
	st := start(t, w.Runner(t, Setup{Dial: cutter.Dial}))
	settle(t, w, st, len(ids))
	deadline := time.Now().Add(patience)
	for !st.r.Health().Healthy() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if h := st.r.Health(); !h.Healthy() {
		t.Errorf("not Healthy after every record was committed: %+v", h)
	}
	st.stop(t)
	if !cutter.Cut() {
		t.Fatal("no COMMIT was cut: the fault never struck")
	}
	exactly(t, "effects", w.Effects(t), ids)
}
