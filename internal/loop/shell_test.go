package loop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/eoskit/eoskit"
)

// The restarts end by the bound that is set: restarts in a row, time
// without progress, or at the first when neither is.
func TestRestartsGiveUp(t *testing.T) {
	for _, c := range []struct {
		name   string
		r      Restarts
		inARow int
		since  time.Duration
		want   string
	}{
		{"no bound: the first restart is refused", Restarts{}, 1, 0, "a session failed"},
		{"within the restarts in a row", Restarts{InARow: 3}, 3, time.Hour, ""},
		{"past the restarts in a row", Restarts{InARow: 3}, 4, 0, "3 session restarts in a row"},
		{"within the time without progress", Restarts{WithoutProgress: time.Minute}, 100, 59 * time.Second, ""},
		{"past the time without progress", Restarts{WithoutProgress: time.Minute}, 1, 61 * time.Second, "1m1s without progress"},
	} {
		if got := c.r.giveUp(c.inARow, c.since); got != c.want {
			t.Errorf("%s: giveUp = %q, want %q", c.name, got, c.want)
		}
	}
}

// The shell refuses a second Run, restarts a session that asks for it,
// starts the count over after progress, gives up past the bound naming
// the cause, shows a failure (not a stand-by) in Health, and runs Start
// once and Stopped last with what Run returns.
func TestShellRunsSessionsUntilTheyEndOrGiveUp(t *testing.T) {
	cause := errors.New("broker gone")
	var sh Shell
	obs := NewObserver("test", "g", nil)
	starts, sessions := 0, 0
	var stopped error
	inSession := make(chan struct{})
	release := make(chan struct{})
	spec := Spec{
		Pkg: "test", Obs: obs, Logger: slog.New(slog.DiscardHandler),
		Start: func(context.Context) error { starts++; return nil },
		Session: func(ctx, _ context.Context) (bool, error) {
			sessions++
			if sessions == 1 {
				close(inSession)
				<-release
			}
			switch sessions {
			case 1, 2:
				return false, &RestartError{Err: cause, StandingBy: sessions == 1}
			case 3:
				return true, Restart(cause) // progressed: the count starts over
			}
			return false, Restart(cause)
		},
		Restarts: Restarts{Base: time.Millisecond, Limit: time.Millisecond, InARow: 2},
		Stopped:  func(err error) { stopped = err },
	}
	done := make(chan error, 1)
	go func() { done <- sh.Run(context.Background(), spec) }()
	<-inSession
	if err := sh.Run(context.Background(), spec); !errors.Is(err, eoskit.ErrRunning) {
		t.Errorf("a second Run returned %v, want ErrRunning", err)
	}
	if h := obs.Health(); !h.Running || h.LastError != "" {
		t.Errorf("while the first session runs: Health %+v, want Running and no error", h)
	}
	close(release)
	err := <-done
	// Sessions 1 and 2 restart (2 in a row), 3 progressed (count 1), 4
	// makes 2 in a row, 5 makes 3: past the bound.
	if sessions != 5 || starts != 1 {
		t.Errorf("ran %d sessions and %d starts, want 5 and 1", sessions, starts)
	}
	if !errors.Is(err, cause) || !strings.Contains(err.Error(), "test: giving up after 2 session restarts in a row") {
		t.Errorf("Run returned %v, want the cause after 2 restarts in a row", err)
	}
	if stopped != err {
		t.Errorf("Stopped saw %v, want what Run returned (%v)", stopped, err)
	}
	if h := obs.Health(); h.Running || !strings.Contains(h.LastError, "broker gone") {
		t.Errorf("after Run: Health %+v, want not running and the cause", h)
	}
}

// A session that returns nil, or anything that is no RestartError, ends
// Run with it; a RestartError after ctx ended is a shutdown; a failed
// Start ends Run before any session.
func TestShellEndsOnWhatIsNoRestart(t *testing.T) {
	final := errors.New("fenced")
	var sh Shell
	spec := func(start error, ret error, cancel context.CancelFunc) Spec {
		return Spec{Pkg: "test", Obs: NewObserver("test", "g", nil), Logger: slog.New(slog.DiscardHandler),
			Start: func(context.Context) error { return start },
			Session: func(context.Context, context.Context) (bool, error) {
				if cancel != nil {
					cancel()
				}
				return false, ret
			},
			Restarts: Restarts{Base: time.Millisecond, InARow: 100}}
	}
	if err := sh.Run(context.Background(), spec(nil, final, nil)); err != final {
		t.Errorf("a final error: Run returned %v", err)
	}
	if err := sh.Run(context.Background(), spec(nil, nil, nil)); err != nil {
		t.Errorf("a session that ended: Run returned %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := sh.Run(ctx, spec(nil, Restart(final), cancel)); err != nil {
		t.Errorf("a restart asked for as ctx ended: Run returned %v, want nil", err)
	}
	if err := sh.Run(context.Background(), spec(final, errors.New("session ran"), nil)); err != final {
		t.Errorf("a failed Start: Run returned %v", err)
	}
	// ctx's end cuts the start checks short, or a session: a shutdown.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if err := sh.Run(ctx, spec(fmt.Errorf("read the schema: %w", context.Canceled), nil, nil)); err != nil {
		t.Errorf("start checks cut short by ctx's end: Run returned %v, want nil", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	if err := sh.Run(ctx, spec(nil, fmt.Errorf("commit: %w", context.Canceled), cancel)); err != nil {
		t.Errorf("a session's error that is ctx's end: Run returned %v, want nil", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	if err := sh.Run(ctx, spec(nil, final, cancel)); err != final {
		t.Errorf("a final error as ctx ended: Run returned %v, want it", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	stop := &eoskit.RecordError{Topic: "t", Err: fmt.Errorf("handler: %w", context.Canceled)}
	if err := sh.Run(ctx, spec(nil, stop, cancel)); err != stop {
		t.Errorf("a record's stop on ctx's error as ctx ended: Run returned %v, want the record error", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	sessions := 0
	cut := spec(nil, nil, nil)
	cut.Start = func(context.Context) error { cancel(); return nil }
	cut.Session = func(context.Context, context.Context) (bool, error) { sessions++; return false, nil }
	if err := sh.Run(ctx, cut); err != nil || sessions != 0 {
		t.Errorf("ctx ended during the start checks: Run returned %v after %d sessions, want nil and none", err, sessions)
	}
	var inside error
	if err := sh.Exclusive(func() error { inside = sh.Run(context.Background(), spec(nil, nil, nil)); return nil }); err != nil || !errors.Is(inside, eoskit.ErrRunning) {
		t.Errorf("Exclusive: %v, and Run inside it %v, want nil and ErrRunning", err, inside)
	}
}
