package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/cmd/eoslab/internal/eoslab"
	"github.com/eoskit/eoskit/testsupport/embeddedpg"
)

// needsDatabase reports whether a pattern --only selects needs PostgreSQL.
func needsDatabase(only string) bool {
	for _, p := range eoslab.All() {
		if p.NeedsDatabase && strings.Contains(p.Name, only) {
			return true
		}
	}
	return false
}

// embedded is the PostgreSQL of a run without --database-url. It starts in
// the background, so that a first run's download and every run's initdb
// overlap the Kafka patterns, which come first.
type embedded struct {
	stderr io.Writer
	cancel context.CancelFunc
	done   chan struct{}
	srv    *embeddedpg.Server
	err    error

	once sync.Once
	db   *pgxpool.Pool
}

// startEmbedded starts the server, saying on stderr what it does.
func startEmbedded(ctx context.Context, stderr io.Writer) *embedded {
	ctx, cancel := context.WithCancel(ctx)
	e := &embedded{stderr: stderr, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		e.srv, e.err = embeddedpg.Start(ctx, embeddedpg.Options{
			Progress: func(step string) { fmt.Fprintln(stderr, "eoslab: postgres:", step) },
		})
	}()
	return e
}

// pool waits for the server (Start has a deadline on every step) and
// returns a pool on it, or nil, having said in one line why there is none:
// then the database patterns are skipped.
func (e *embedded) pool(ctx context.Context) *pgxpool.Pool {
	e.once.Do(func() {
		<-e.done
		err := e.err
		if err == nil {
			e.db, err = pgxpool.New(ctx, e.srv.URL())
		}
		if err != nil && ctx.Err() == nil { // interrupted: nothing to explain
			fmt.Fprintln(e.stderr, "eoslab: no embedded PostgreSQL, so the database patterns are skipped (give --database-url):", err)
		}
		if err != nil {
			return
		}
		fmt.Fprintln(e.stderr, "eoslab: the database patterns run on an embedded PostgreSQL", embeddedpg.Version+", thrown away on exit")
	})
	return e.db
}

// stop abandons a start still under way, or stops the server and deletes
// its data.
func (e *embedded) stop() {
	e.cancel()
	<-e.done
	if e.db != nil {
		e.db.Close()
	}
	if e.srv != nil {
		if err := e.srv.Stop(); err != nil {
			fmt.Fprintln(e.stderr, "eoslab:", err)
		}
	}
}

// syncWriter serialises writes: the embedded server's progress comes from
// its own goroutine.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
