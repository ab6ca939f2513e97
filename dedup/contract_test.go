package dedup_test

import (
	"context"
	"errors"
	"fmt"
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
		Features: contract.Features{Transient: true},
		New: func(t *testing.T) contract.World {
			return &world{b: newBed(t, 3), group: integration.UniqueName(t, "g")}
		},
	})
}

// world is a contract's bed and group; seeded counts the messages
// written, so that each Seed's ids are new.
type world struct {
	b      *bed
	group  string
	seeded int
}

func (w *world) Seed(t *testing.T, n int) []string {
	recs := make([]*kgo.Record, n)
	ids := make([]string, n)
	for i := range recs {
		ids[i] = fmt.Sprintf("m%d", w.seeded+i)
		recs[i] = dedup.Stamp(&kgo.Record{Key: []byte(ids[i]), Value: []byte(ids[i])})
	}
	w.seeded += n
	w.b.produce(t, recs...)
	return ids
}

func (w *world) Runner(t *testing.T, s contract.Setup) contract.Runner {
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		if s.Handle != nil {
			err := s.Handle(ctx, string(r.Value), r.Offset)
			if errors.Is(err, contract.ErrTransient) {
				_, err = tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
				return fmt.Errorf("updating the stock: %w", err)
			}
			if err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (id, consumer) VALUES ($1, 'contract')`, string(r.Value))
		return err
	}
	opts := []dedup.Option{dedup.Brokers(w.b.k.Brokers...), dedup.Topics(w.b.topic), dedup.Group(w.group),
		dedup.ClientOptions(kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())),
		dedup.MaxRecordsPerCommit(50), dedup.OnHandlerError(s.Policy)}
	if s.DrainSet {
		opts = append(opts, dedup.DrainTimeout(s.Drain))
	}
	if s.Metrics != nil {
		opts = append(opts, dedup.WithMetrics(s.Metrics))
	}
	c, err := dedup.NewConsumer(w.b.pool, w.b.store, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (w *world) ids(t *testing.T, query string, args ...any) []string {
	rows, err := w.b.pool.Query(context.Background(), query, args...)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func (w *world) Effects(t *testing.T) []string { return w.ids(t, `SELECT id FROM effects`) }

func (w *world) DeadLettered(t *testing.T) []string {
	return w.ids(t, `SELECT convert_from(value, 'UTF8') FROM eoskit_dead_letters WHERE consumer_group = $1`, w.group)
}

func (w *world) Settled(t *testing.T) int {
	var n int
	if err := w.b.pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM effects) + (SELECT count(*) FROM eoskit_dead_letters WHERE consumer_group = $1)`, w.group).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (w *world) DeadLetter() eoskit.ErrorPolicy { return dedup.DeadLetter() }
