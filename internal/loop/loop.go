// Package loop is the core that eoskit's runners (eos.Processor,
// offsetstore.Runner, dedup.Consumer, and outbox.Relay where it applies)
// share, so that each concept has one shape: one poll step, one error
// policy (stop, retry then a fallback, dead-letter), one jittered backoff
// and a sleep that ends with its context, one recovery of a handler's
// panic, one record error and one "already running" error.
package loop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/authz"
)

// Poll is the one poll step: it polls up to max records with poll, shows
// obs their lag, and logs the fetch errors. stop is true when ctx, the
// runner's, ended: the loop returns without error (poll may end sooner
// under a context of its own, and what it returned is kept). err is
// kgo.ErrClientClosed when the client was closed under the loop, or an
// *eoskit.AuthorizationError once refused reads last (refused tells).
// Other fetch errors are logged, not returned: franz-go retries them
// itself.
func Poll(ctx context.Context, poll func(context.Context, int) kgo.Fetches, max int, obs *Observer, logger *slog.Logger, refused *authz.Watch) (f kgo.Fetches, stop bool, err error) {
	f = poll(ctx, max)
	if ctx.Err() != nil {
		return nil, true, nil
	}
	obs.Fetched(f)
	if f.IsClientClosed() {
		return nil, false, kgo.ErrClientClosed
	}
	LogFetchErrors(f, logger)
	if err := refused.Check(f, time.Now()); err != nil {
		return nil, false, err
	}
	return f, false, nil
}

// PipelineFetchMaxWait is the kgo.FetchMaxWait of a runner that pauses
// and resumes partitions (Concurrency above 1), unless its ClientOptions
// set one: how long a resumed partition may wait for the fetch in flight
// to its broker (kgo's default is 5 s).
const PipelineFetchMaxWait = 100 * time.Millisecond

// LogFetchErrors logs what a poll reported besides records, leaving out
// the context errors of a poll that timed out on purpose.
func LogFetchErrors(f kgo.Fetches, logger *slog.Logger) {
	f.EachError(func(topic string, partition int32, err error) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return
		}
		logger.Warn("fetch error", "topic", topic, "partition", partition, "err", err)
	})
}

// Sleep waits d, or less if ctx ends first; it reports whether it waited the
// whole d.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Recover runs a user's handler call, turning a panic into an error
// ("<pkg>: handler panicked: ..."), so that it follows the error policy
// like any failed record instead of ending the process.
func Recover(pkg string, call func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if e, ok := v.(error); ok {
				err = fmt.Errorf("%s: handler panicked: %w", pkg, e) // an error policy's rules see it
				return
			}
			err = fmt.Errorf("%s: handler panicked: %v", pkg, v)
		}
	}()
	return call()
}
