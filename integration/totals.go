package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/verify"
)

// VerifyTotals runs query on pool, which must return rows of a key (text)
// and a total (an integer), and fails the test unless those totals are
// want's ([verify.CheckTotals]: each key short or over, by how much). It is
// the check of a pipeline whose results are aggregates: a count or a sum
// per key, exact only if every input was applied once.
func VerifyTotals(tb testing.TB, pool *pgxpool.Pool, query string, want map[string]int64) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, query)
	if err != nil {
		tb.Fatalf("integration: read totals: %v", err)
	}
	got := map[string]int64{}
	var key string
	var total int64
	if _, err := pgx.ForEachRow(rows, []any{&key, &total}, func() error {
		got[key] += total
		return nil
	}); err != nil {
		tb.Fatalf("integration: read totals: %v", err)
	}
	if err := verify.CheckTotals(want, got); err != nil {
		tb.Fatal(err)
	}
}
