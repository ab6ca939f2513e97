package offsetstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/testsupport/contract"
)

// The contracts every runner keeps (testsupport/contract): the error
// policy and its classification, the handler error shapes, the shutdown,
// the drain, health and metrics, here over a runner loading its input
// into a table, parking in its dead-letter table.
func TestContracts(t *testing.T) {
	t.Parallel()
	contract.Run(t, contract.Subject{
		Features: contract.Features{Database: true, Batches: true},
		New: func(t *testing.T) contract.World {
			b := newBed(t, 3, 0)
			return &world{Seeder: &contract.Seeder{Brokers: b.k.Brokers, Topic: b.topic}, b: b}
		},
	})
}

// world is a contract's bed: topic, group, tables.
type world struct {
	*contract.Seeder
	b *bed
}

func (w *world) Runner(t *testing.T, s contract.Setup) contract.Runner {
	h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		for _, r := range recs {
			if s.Handle == nil {
				break
			}
			err := s.Handle(ctx, string(r.Key), r.Offset)
			if dbErr, ok := errors.AsType[*contract.DatabaseError](err); ok {
				return contract.Fail(ctx, tx, dbErr)
			}
			if err != nil {
				return err
			}
		}
		return load(nil)(ctx, tx, recs)
	}
	opts := []offsetstore.Option{offsetstore.Brokers(w.b.k.Brokers...), offsetstore.Group(w.b.group),
		offsetstore.Topics(w.b.topic), offsetstore.ClientOptions(testClientOpts()...),
		offsetstore.MaxRecordsPerCommit(50), offsetstore.OnHandlerError(s.Policy)}
	if s.DrainSet {
		opts = append(opts, offsetstore.DrainTimeout(s.Drain))
	}
	if s.Metrics != nil {
		opts = append(opts, offsetstore.WithMetrics(s.Metrics))
	}
	pool := w.b.runner
	if s.Dial != nil {
		pool = contract.PoolWith(t, w.b.dbURL, s.Dial)
	}
	r, err := offsetstore.NewRunner(pool, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (w *world) Effects(t *testing.T) []string {
	return contract.Strings(t, w.b.pool, `SELECT id FROM results`)
}

func (w *world) DeadLettered(t *testing.T) []string {
	return contract.Strings(t, w.b.pool, `SELECT convert_from(key, 'UTF8') FROM eoskit_dead_letters WHERE consumer_group = $1`, w.b.group)
}

func (w *world) DeadLetterErrors(t *testing.T) map[string]string {
	return contract.Texts(t, w.b.pool, `SELECT convert_from(key, 'UTF8'), error FROM eoskit_dead_letters WHERE consumer_group = $1`, w.b.group)
}

func (w *world) Settled(t *testing.T) int { return contract.Count(t, w.b.pool, "results", w.b.group) }

func (w *world) DeadLetter() eoskit.ErrorPolicy { return offsetstore.DeadLetter() }
