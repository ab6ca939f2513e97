package contract

import (
	"context"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
)

// Seeder is a World's Seed over a topic: records from a transactional
// producer that aborts a transaction of 50 after each it commits, keyed
// (and valued) by ids new to every Seed, so that a record applied again
// shows as a duplicate.
type Seeder struct {
	Brokers []string
	Topic   string
	seeded  int
}

// Seed writes n committed records (and as many aborted) and returns the
// committed ones' ids in the order written.
func (s *Seeder) Seed(t *testing.T, n int) []string {
	t.Helper()
	s.seeded++
	prefix := fmt.Sprintf("s%d-", s.seeded)
	committed, _, err := integration.SeedTransactional(context.Background(), s.Brokers, s.Topic, n, 50, func(r *kgo.Record) {
		r.Key = append([]byte(prefix), r.Key...)
		r.Value = r.Key
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range committed {
		committed[i] = prefix + committed[i]
	}
	return committed
}
