package loop

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/eoskit/eoskit"
)

// recordRetryLimit caps the pauses of a Retry error policy (unless its
// backoff is larger): one cap for every runner.
const recordRetryLimit = 30 * time.Second

// RecordBackoff is the pause before retry number attempt (from 1) of a
// record under the Retry policy p (see [eoskit.Retry]).
func RecordBackoff(attempt int, p eoskit.ErrorPolicy) time.Duration {
	return Backoff(attempt, p.Backoff(), recordRetryLimit)
}

// Backoff is the pause before retry number attempt (from 1): base doubled
// each attempt, capped at limit (or at base when base is larger), and
// drawn at random from its upper half, so that instances failing together
// do not retry in step. A base of 0 gives 0.
func Backoff(attempt int, base, limit time.Duration) time.Duration {
	if base <= 0 {
		return 0
	}
	limit = max(limit, base)
	d := base
	for i := 1; i < attempt && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return d/2 + rand.N(d/2+1)
}

// Retry pauses for work that failed for no record's fault (a database or
// broker error): from retryBase, doubling, up to retryLimit, jittered.
const (
	retryBase  = 200 * time.Millisecond
	retryLimit = 5 * time.Second
)

// PauseBeforeRetry sleeps before retry number attempt (from 1) of work that
// failed for no record's fault, the one backoff all runners use for it; it
// reports false when ctx ended first.
func PauseBeforeRetry(ctx context.Context, attempt int) bool {
	return Sleep(ctx, Backoff(attempt, retryBase, retryLimit))
}
