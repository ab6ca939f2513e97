package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/outbox"
)

// runOutbox runs `eoskit outbox resume-after FLAGS`; args start at the
// verb.
func runOutbox(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) < 1 || args[0] != "resume-after" {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	fs := flag.NewFlagSet("eoskit outbox resume-after", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kf := addKafkaFlags(fs)
	db := addDatabaseFlag(fs, "the outbox's PostgreSQL")
	positions := fs.String("position-topic", "", "the relay's position topic (outbox.PositionTopic)")
	lsn := fs.String("lsn", "", "where the restored server's log began to differ, as 0/1A2B3C4: transactions ending past it are published, those at or before it taken as published")
	name := fs.String("outbox", "", "the outbox, as outbox.Name gives it (default: the database's default outbox)")
	slot := fs.String("slot", "", "the relay's replication slot, when it was given one (outbox.Slot)")
	txnID := fs.String("transactional-id", "", "the relay's transactional id, when it was given one (outbox.TransactionalID)")
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	dbURL, code := db.connString(stderr, "name the outbox's database: $DATABASE_URL, -database-url, or libpq's PG* variables")
	switch {
	case code != exitOK:
		return code
	case *positions == "" || *lsn == "":
		fmt.Fprintln(stderr, "-position-topic and -lsn are required: the relay's position topic, and where the restored log began to differ")
		return exitUsage
	}
	conn, err := kf.connect()
	if err != nil {
		fmt.Fprintln(stderr, "eoskit:", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *kf.timeout)
	defer cancel()
	if err := loop.ConnectError(ctx, "eoskit", conn.opts); err != nil {
		fmt.Fprintf(stderr, "eoskit: reach %s: %v\n", strings.Join(conn.seeds, ","), err)
		return exitError
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		fmt.Fprintln(stderr, "eoskit:", err)
		return exitUsage
	}
	defer pool.Close()
	opts := []outbox.Option{outbox.Brokers(conn.seeds...), outbox.PositionTopic(*positions), outbox.ClientOptions(conn.opts...),
		outbox.Logger(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))}
	if *name != "" {
		opts = append(opts, outbox.Name(*name))
	}
	if *slot != "" {
		opts = append(opts, outbox.Slot(*slot))
	}
	if *txnID != "" {
		opts = append(opts, outbox.TransactionalID(*txnID))
	}
	r, err := outbox.NewRelay(pool, opts...)
	if err != nil {
		fmt.Fprintln(stderr, "eoskit:", err)
		return exitUsage
	}
	if err := r.ResumeAfter(ctx, *lsn); err != nil {
		fmt.Fprintln(stderr, "eoskit:", err)
		return exitError
	}
	if *kf.json {
		jsonOutput{stdout}.print(map[string]string{"position": *lsn})
		return exitOK
	}
	fmt.Fprintf(stdout, "the relay's position is %s: its next run publishes every transaction that ends past it\n", *lsn)
	return exitOK
}
