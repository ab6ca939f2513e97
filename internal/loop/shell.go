package loop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/eoskit/eoskit"
)

// Shell is the Run that every runner (eos.Processor, the consume core of
// offsetstore and dedup, outbox.Relay) is: it refuses a second Run at
// once, shows the observer that the runner runs (and the error Run
// returned), gives the work its drain, runs the runner's start checks
// once, and then its sessions, starting a new one with backoff after a
// session that asked for it (a *RestartError), until one returns anything
// else or the restarts run out. Whatever ctx's end cuts short (the start
// checks, a session's error that is ctx's) is a shutdown: Run returns nil.
// The runner supplies what differs in a [Spec]. The zero Shell is ready;
// a runner keeps one for its lifetime.
type Shell struct {
	running atomic.Bool
}

// Spec is what a runner supplies its Shell.
type Spec struct {
	// Pkg prefixes the errors and log lines the shell writes.
	Pkg string
	// Obs shows Running, and each restart's cause as a failure.
	Obs    *Observer
	Logger *slog.Logger
	// Drain is how long the work a session does outlives Run's ctx (see
	// Drained): 0 ends it with ctx.
	Drain time.Duration
	// Start runs once, before the first session (connection, ACL and
	// topic checks): its error ends Run.
	Start func(ctx context.Context) error
	// Session runs one session, polling under ctx and working under
	// work. It returns nil once ctx ended, an error wrapping a
	// *RestartError for a new session, or the error Run returns.
	// progressed reports that it committed work, which starts the count
	// of restarts in a row over.
	Session func(ctx, work context.Context) (progressed bool, err error)
	// Restarts bounds the sessions; the zero value makes every
	// RestartError final.
	Restarts Restarts
	// Stopped runs when Run returns, with what it returns.
	Stopped func(err error)
}

// Restarts says how a Shell restarts sessions: after a backoff from Base
// doubling to Limit (jittered, see Backoff), until InARow restarts
// followed one another with no progress, or nothing progressed for
// WithoutProgress (either 0: no such bound).
type Restarts struct {
	Base, Limit     time.Duration
	InARow          int
	WithoutProgress time.Duration
}

// RestartError asks the Shell for a new session: a new client, which
// joins the group afresh and reads the committed positions again.
type RestartError struct {
	Err error
	// StandingBy: the runner stands by behind a live one rather than
	// failing, so Health does not show Err.
	StandingBy bool
}

// Restart wraps err in a *RestartError.
func Restart(err error) error { return &RestartError{Err: err} }

func (e *RestartError) Error() string { return "session must restart: " + e.Err.Error() }
func (e *RestartError) Unwrap() error { return e.Err }

// Run runs spec's sessions under s; see Shell.
func (s *Shell) Run(ctx context.Context, spec Spec) (err error) {
	if !s.running.CompareAndSwap(false, true) {
		return eoskit.ErrRunning
	}
	defer s.running.Store(false)
	spec.Obs.Running(true, nil)
	defer func() { spec.Obs.Running(false, err) }()
	if spec.Stopped != nil {
		defer func() { spec.Stopped(err) }()
	}
	// ctx's end stops polling; work, which handlers, producing and
	// committing run under, ends Drain later.
	work, done := Drained(ctx, spec.Drain)
	defer done()
	if spec.Start != nil {
		if err := spec.Start(ctx); err != nil {
			if cutShort(ctx, err) {
				return nil // shut down before it started: the checks were cut short
			}
			return err
		}
	}
	inARow, lastProgress := 0, time.Now()
	for {
		if ctx.Err() != nil {
			return nil // shut down before a session joined the group
		}
		progressed, err := spec.Session(ctx, work)
		var restart *RestartError
		if !errors.As(err, &restart) {
			if cutShort(ctx, err) {
				return nil // what ctx's end cut short is a shutdown, not a failure
			}
			return err
		}
		if ctx.Err() != nil {
			return nil // the session ended with ctx: shut down
		}
		if progressed {
			inARow, lastProgress = 0, time.Now()
		}
		inARow++
		if !restart.StandingBy {
			spec.Obs.Failed(restart.Err)
		}
		if why := spec.Restarts.giveUp(inARow, time.Since(lastProgress)); why != "" {
			return fmt.Errorf("%s: giving up after %s: %w", spec.Pkg, why, restart.Err)
		}
		wait := Backoff(inARow, spec.Restarts.Base, spec.Restarts.Limit)
		spec.Logger.Warn(spec.Pkg+": restarting the session", "err", restart.Err, "attempt", inARow, "backoff", wait)
		if !Sleep(ctx, wait) {
			return nil
		}
	}
}

// cutShort reports whether err is ctx's end and nothing more: a record
// error (a Stop on a record whose handler returned ctx's error) is still
// reported.
func cutShort(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, ctx.Err()) && !errors.As(err, new(*eoskit.RecordError))
}

// giveUp says why the restarts end after inARow of them in a row, the
// last progress since ago, or "" when they go on.
func (r Restarts) giveUp(inARow int, since time.Duration) string {
	switch {
	case r.InARow == 0 && r.WithoutProgress == 0:
		return "a session failed"
	case r.InARow > 0 && inARow > r.InARow:
		return fmt.Sprintf("%d session restarts in a row", r.InARow)
	case r.WithoutProgress > 0 && since > r.WithoutProgress:
		return fmt.Sprintf("%s without progress", since.Round(time.Second))
	}
	return ""
}

// Exclusive runs fn unless a Run of s runs (eoskit.ErrRunning), and keeps
// Run from starting meanwhile: for what must not overlap a Run (an
// operator's change of its position, say).
func (s *Shell) Exclusive(fn func() error) error {
	if !s.running.CompareAndSwap(false, true) {
		return eoskit.ErrRunning
	}
	defer s.running.Store(false)
	return fn()
}
