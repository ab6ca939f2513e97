package dashboard_test

import (
	"context"
	"sync"
	"testing"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/patterns/dashboard"
)

// Every replica of a deployable main runs Migrate as it starts: eight at
// once on a fresh database all succeed. Before, two CREATE TABLE IF NOT
// EXISTS of the same table at once could fail one of them (a duplicate
// key in pg_type; issue 47 item 6, failing on 3bfa998 in 5 of 5 runs).
func TestConcurrentMigratesAllSucceed(t *testing.T) {
	for round := range 5 {
		pool := integration.Postgres(t)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() { errs <- dashboard.Migrate(context.Background(), pool, "dash") })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: a concurrent Migrate failed: %v", round, err)
			}
		}
	}
}
