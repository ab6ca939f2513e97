package dedup_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/contract"
)

// The contracts every runner keeps (testsupport/contract): the error
// policy and its classification, the handler error shapes, the shutdown,
// the drain, health and metrics, here over a consumer claiming each
// message's id with its effect row, parking in its dead-letter table.
func TestContracts(t *testing.T) {
	t.Parallel()
	contract.Run(t, contract.Subject{
		Features: contract.Features{Database: true},
		New: func(t *testing.T) contract.World {
			b := newBed(t, 3)
			return &world{Seeder: &contract.Seeder{Brokers: b.k.Brokers, Topic: b.topic}, b: b, group: integration.UniqueName(t, "g")}
		},
	})
}

// world is a contract's bed and group.
type world struct {
	*contract.Seeder
	b     *bed
	group string
}

func (w *world) Runner(t *testing.T, s contract.Setup) contract.Runner {
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if s.Handle != nil {
			err := s.Handle(ctx, string(r.Value), r.Offset)
			if dbErr, ok := errors.AsType[*contract.DatabaseError](err); ok {
				return contract.Fail(ctx, tx, dbErr)
			}
			if err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (id, consumer) VALUES ($1, 'contract')`, string(r.Value))
		return err
	}
	opts := []dedup.Option{dedup.Brokers(w.b.k.Brokers...), dedup.Topics(w.b.topic), dedup.Group(w.group), dedup.ID(dedup.KeyID()),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
		dedup.MaxRecordsPerCommit(50), dedup.OnHandlerError(s.Policy)}
	if s.DrainSet {
		opts = append(opts, dedup.DrainTimeout(s.Drain))
	}
	if s.Metrics != nil {
		opts = append(opts, dedup.WithMetrics(s.Metrics))
	}
	pool := w.b.pool
	if s.Dial != nil {
		pool = contract.PoolWith(t, w.b.dbURL, s.Dial)
	}
	c, err := dedup.NewConsumer(pool, w.b.store, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (w *world) Effects(t *testing.T) []string {
	return contract.Strings(t, w.b.pool, `SELECT id FROM effects`)
}

func (w *world) DeadLettered(t *testing.T) []string {
	return contract.Strings(t, w.b.pool, `SELECT convert_from(value, 'UTF8') FROM eoskit_dead_letters WHERE consumer_group = $1`, w.group)
}

func (w *world) DeadLetterErrors(t *testing.T) map[string]string {
	return contract.Texts(t, w.b.pool, `SELECT convert_from(value, 'UTF8'), error FROM eoskit_dead_letters WHERE consumer_group = $1`, w.group)
}

func (w *world) Settled(t *testing.T) int { return contract.Count(t, w.b.pool, "effects", w.group) }

func (w *world) DeadLetter() eoskit.ErrorPolicy { return dedup.DeadLetter() }
