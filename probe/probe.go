package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/eoskit/eoskit"
)

// Routes adds GET /livez, GET /healthz and GET /readyz to mux, answered
// from health (a runner's Health method): /livez holds while Run runs
// (Running), /healthz while it also makes progress ([eoskit.Health.Healthy]),
// /readyz while it is also assigned its work and restores no keyed state
// ([eoskit.Health.Ready]).
func Routes(mux *http.ServeMux, health func() eoskit.Health) {
	mux.Handle("GET /livez", Handler(health, running))
	mux.Handle("GET /healthz", Handler(health, eoskit.Health.Healthy))
	mux.Handle("GET /readyz", Handler(health, eoskit.Health.Ready))
}

func running(h eoskit.Health) bool { return h.Running }

// Handler answers 200 when ok(health()) holds, else 503, with the Health as
// JSON either way.
func Handler(health func() eoskit.Health, ok func(eoskit.Health) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := health()
		body, err := json.Marshal(h)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok(h) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write(append(body, '\n'))
	})
}

// ShutdownTimeout bounds how long a [Server] waits for the requests in
// hand once its context ends.
const ShutdownTimeout = 5 * time.Second

// Server serves a handler from [Start] until its context ends.
type Server struct {
	addr    net.Addr
	stopped chan error
	err     error
	once    sync.Once
}

// Start listens on addr and serves h until ctx ends. It returns once it
// listens, or with why it cannot (a port taken, an address that does not
// parse), so that a main reports a configuration error at its start.
func Start(ctx context.Context, addr string, h http.Handler) (*Server, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("probe: listen on %q: %w", addr, err)
	}
	s := &Server{addr: l.Addr(), stopped: make(chan error, 1)}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	go func() {
		select {
		case <-ctx.Done():
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
			defer cancel()
			err := srv.Shutdown(stopCtx)
			if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) {
				err = errors.Join(err, serveErr)
			}
			s.stopped <- err
		case err := <-served:
			s.stopped <- fmt.Errorf("probe: serving on %s: %w", l.Addr(), err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on (with the port the system
// chose, for an addr of port 0).
func (s *Server) Addr() net.Addr { return s.addr }

// Wait blocks until the server has stopped, after its context ended, and
// returns the error it stopped with: nil for a shutdown that finished the
// requests in hand within [ShutdownTimeout].
func (s *Server) Wait() error {
	s.once.Do(func() { s.err = <-s.stopped })
	return s.err
}

// Serve serves h on addr while run runs, and returns run's error joined
// with the server's. It listens before it calls run, so that an address
// taken is reported at once, before the runner starts, and it stops the
// server when run returns, not when ctx ends: the probes and metrics
// answer while a runner drains. An empty addr serves nothing: Serve is
// run.
func Serve(ctx context.Context, addr string, h http.Handler, run func(context.Context) error) error {
	if addr == "" {
		return run(ctx)
	}
	// Not ctx: the probes answer while run drains after ctx ends.
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	srv, err := Start(serveCtx, addr, h)
	if err != nil {
		return err
	}
	err = run(ctx)
	stopServing()
	return errors.Join(err, srv.Wait())
}
