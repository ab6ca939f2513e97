package dedup_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
)

// A ledger consumer that applies each payment once, however often the
// payment is delivered. It needs a broker and a database, so it is compiled
// but not run by go test; the package's tests run the same shape against
// real ones.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	store, err := dedup.NewPostgresStore("")
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	c, err := dedup.NewConsumer(pool, store,
		func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 1 WHERE id = $1`, r.Key)
			return err
		},
		dedup.Brokers("localhost:9092"), dedup.Group("ledger"), dedup.Topics("payments"))
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

func ExampleStamp() {
	r := dedup.Stamp(&kgo.Record{Topic: "payments", Value: []byte(`{"amount": 5}`)})
	id, _ := dedup.HeaderID(dedup.IDHeader)(r)
	dedup.Stamp(r) // a retry path stamping again keeps the id
	again, _ := dedup.HeaderID(dedup.IDHeader)(r)
	fmt.Println(len(id), id == again)
	// Output: 36 true
}

func ExampleMemoryStore() {
	m := dedup.NewMemoryStore(1000)
	fmt.Println(m.Claim("ledger", "payment-1"), m.Claim("ledger", "payment-1"))
	// Output: true false
}
