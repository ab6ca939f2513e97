package kafkatopostgres_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/kafkatopostgres"
)

// One instance, tuned (smaller batches; a report that is not one parked
// in the database's dead letters instead of stopping the instance), and
// the dashboard's read of the totals it keeps. It needs a broker and a
// database, so it is compiled but not run by go test.
func ExampleRun() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	cfg := kafkatopostgres.Config{Pool: pool, Brokers: []string{"localhost:9092"}, Group: "dashboard-totals", Topic: "case-reports",
		Options: []offsetstore.Option{offsetstore.MaxRecordsPerCommit(100), offsetstore.OnHandlerError(offsetstore.DeadLetter())}}
	if err := kafkatopostgres.Migrate(ctx, cfg); err != nil {
		log.Fatal(err)
	}
	go func() {
		if err := kafkatopostgres.Run(ctx, cfg); err != nil {
			log.Fatal(err)
		}
	}()
	totals, err := dashboard.Totals(ctx, pool, dashboard.DefaultTables)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(totals)
}
