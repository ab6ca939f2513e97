package outboxrelay_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/outboxrelay"
)

// The intake service's side: a report is taken in (here, stored in the
// service's own table) and put in the outbox in one transaction, so that
// it is published if and only if it was taken in. It needs a database, so
// it is compiled but not run by go test.
func ExampleSubmit() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	rep := dashboard.Report{ID: "r7", Region: "north", Cases: 4}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO intake (id, region, cases) VALUES ($1, $2, $3)`, rep.ID, rep.Region, rep.Cases); err != nil {
			return err
		}
		return outboxrelay.Submit(ctx, tx, "case-reports", rep)
	})
	if err != nil {
		log.Fatal(err)
	}
}
