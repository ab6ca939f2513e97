package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/testsupport/contract"
)

// The contract of every runner's Run that fits a relay (testsupport/
// contract; it has no group, handler or error policy of the user's): its
// Health before, while and after Run, a second Run refused at once, Run
// returning nil when its ctx ends, and the same relay running again from
// where it stopped, each record published once.
func TestContracts(t *testing.T) {
	t.Parallel()
	contract.Run(t, contract.Subject{Features: contract.Features{NoGroup: true}, New: func(t *testing.T) contract.World {
		return &world{b: newBed(t, integration.Kafka(t))}
	}})
}

// world is a contract's bed; seeded counts the Seeds, so that each one's
// records are new.
type world struct {
	b      *bed
	seeded int
}

func (w *world) Seed(t *testing.T, n int) []string {
	w.seeded++
	ctx := context.Background()
	ids := make([]string, n)
	for start := 0; start < n; start += 50 {
		recs := make([]*kgo.Record, 0, 50)
		for i := start; i < min(start+50, n); i++ {
			ids[i] = fmt.Sprintf("s%d-%d", w.seeded, i)
			recs = append(recs, &kgo.Record{Topic: w.b.out, Key: []byte(ids[i]), Value: []byte(ids[i])})
		}
		if err := pgx.BeginFunc(ctx, w.b.pool, func(tx pgx.Tx) error { return outbox.Write(ctx, tx, recs...) }); err != nil {
			t.Fatal(err)
		}
		// A rolled-back transaction, whose rows no relay may publish.
		_ = pgx.BeginFunc(ctx, w.b.pool, func(tx pgx.Tx) error {
			if err := outbox.Write(ctx, tx, &kgo.Record{Topic: w.b.out, Value: []byte("rolled-back")}); err != nil {
				return err
			}
			return fmt.Errorf("roll back")
		})
	}
	return ids
}

func (w *world) Runner(t *testing.T, s contract.Setup) contract.Runner {
	if s.Handle != nil {
		t.Fatal("a relay runs no handler")
	}
	r, err := outbox.NewRelay(w.b.pool, w.b.opts(t)...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (w *world) Effects(t *testing.T) []string {
	var ids []string
	for _, r := range w.b.k.ReadAll(w.b.out, kgo.ReadCommitted(), time.Minute) {
		ids = append(ids, string(r.Value))
	}
	return ids
}

func (w *world) DeadLettered(*testing.T) []string              { return nil }
func (w *world) DeadLetterErrors(*testing.T) map[string]string { return nil }
func (w *world) Settled(t *testing.T) int                      { return w.b.published(t) }
func (w *world) DeadLetter() eoskit.ErrorPolicy                { return eoskit.Stop() }
