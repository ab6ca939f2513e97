package offsetstore_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/offsetstore"
)

// A loader that writes each order to PostgreSQL exactly once. It needs a
// broker and a database, so it is compiled but not run by go test; the
// package's tests run the same shape against real ones.
func ExampleNewRunner() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := offsetstore.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	r, err := offsetstore.NewRunner(pool,
		func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
			for _, rec := range recs {
				// Every write goes through tx: it commits with the offsets.
				if _, err := tx.Exec(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, rec.Key, rec.Value); err != nil {
					return err
				}
			}
			return nil
		},
		offsetstore.Brokers("localhost:9092"),
		offsetstore.Group("orders-loader"),
		offsetstore.Topics("orders"),
		offsetstore.OnHandlerError(offsetstore.DeadLetter()),
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
