package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/outbox"
)

// An order service marks an order paid and publishes the event in the
// same database transaction. It needs a database, so it is compiled but
// not run by go test; the package's tests run the same shape against real
// ones.
func ExampleWrite() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET state = 'paid' WHERE id = $1`, "o-42"); err != nil {
			return err
		}
		return outbox.Write(ctx, tx, &kgo.Record{Topic: "orders", Key: []byte("o-42"), Value: []byte(`{"state":"paid"}`)})
	})
	if err != nil {
		log.Fatal(err)
	}
}

// The relay, in its own process (or beside the service), until SIGTERM.
// A second instance started beside it stands by and takes over when it
// stops.
func ExampleRelay_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	r, err := outbox.NewRelay(pool, outbox.Brokers("localhost:9092"),
		outbox.DeadLetter("orders-dead-letters"))
	if err != nil {
		log.Fatal(err)
	}
	err = r.Run(ctx)
	if rerr, ok := errors.AsType[*outbox.RecordError](err); ok {
		log.Fatalf("outbox record %d (for %s) needs attention: %v", rerr.ID, rerr.Topic, rerr.Err)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// Options are checked when the relay is made, not when it runs.
func ExampleNewRelay() {
	_, err := outbox.NewRelay(new(pgxpool.Pool), outbox.Brokers("localhost:9092"), outbox.WithSemantics(eos.AtMostOnce))
	fmt.Println(errors.Is(err, eoskit.ErrInvalidConfig))
	// Output: true
}

// A billing service beside others in one database: its own outbox, named
// once and given to Migrate, the writer and the relay alike. Its relay
// publishes only billing's rows; the others' relays, only theirs. It
// needs a database, so it is compiled but not run by go test.
func ExampleName() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	billing := outbox.Name("billing") // eoskit_outbox_billing, its publication and its slot
	if err := outbox.Migrate(ctx, pool, billing); err != nil {
		log.Fatal(err)
	}
	w, err := outbox.NewWriter(billing)
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE invoices SET state = 'sent' WHERE id = $1`, "i-7"); err != nil {
			return err
		}
		return w.Write(ctx, tx, &kgo.Record{Topic: "invoices", Key: []byte("i-7"), Value: []byte(`{"state":"sent"}`)})
	})
	if err != nil {
		log.Fatal(err)
	}
	r, err := outbox.NewRelay(pool, billing, outbox.Brokers("localhost:9092"))
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A name is checked where it is given, before anything reaches the
// server: this writer is never made.
func ExampleNewWriter() {
	_, err := outbox.NewWriter(outbox.Name("Billing"))
	fmt.Println(err)
	// Output: outbox: invalid configuration: Name: "Billing": an outbox's name holds only lower-case letters, digits and _ (it is part of its replication slot's name)
}
