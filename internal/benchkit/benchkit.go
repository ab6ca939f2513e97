// Package benchkit holds what eoskit's benchmark commands share: reading
// the services from the environment, failing loudly, and medians.
package benchkit

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Fail prints err under the command's name and exits 1.
func Fail(cmd string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", cmd, err)
	os.Exit(1)
}

// Services returns KAFKA_BROKERS and, when needDB, DATABASE_URL, failing
// with a hint when one is missing.
func Services(cmd string, needDB bool) (brokers []string, dbURL string) {
	brokers = strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	dbURL = os.Getenv("DATABASE_URL")
	if brokers[0] == "" || needDB && dbURL == "" {
		Fail(cmd, fmt.Errorf("set KAFKA_BROKERS%s (make bench starts the services and sets them)", map[bool]string{true: " and DATABASE_URL"}[needDB]))
	}
	return brokers, dbURL
}

// Exec runs sql on pool or fails.
func Exec(ctx context.Context, cmd string, pool *pgxpool.Pool, sql string) {
	if _, err := pool.Exec(ctx, sql); err != nil {
		Fail(cmd, fmt.Errorf("%s: %w", sql, err))
	}
}

// Median returns the median of xs (the upper one for an even count).
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
