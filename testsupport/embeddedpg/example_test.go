package embeddedpg_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/testsupport/embeddedpg"
)

// A throw-away PostgreSQL for a program or a test: started, used through
// its URL, stopped (which deletes its data). When the binaries cannot be
// had, the error says why and wraps ErrUnavailable.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv, err := embeddedpg.Start(ctx, embeddedpg.Options{Progress: func(s string) { log.Print(s) }})
	if errors.Is(err, embeddedpg.ErrUnavailable) {
		fmt.Println("no PostgreSQL here:", err)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()

	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	var level string
	if err := pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		log.Fatal(err)
	}
	fmt.Println("wal_level:", level)
}
