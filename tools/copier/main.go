// Command copier copies the chaos suite's input (records keyed "in-N") along
// one exactly-once path, as a separate OS process that the suite kills,
// stops and restarts:
//
//	copier -path eos         -brokers B -group G -in T -out T2 -instance 0
//	copier -path offsetstore -brokers B -group G -in T -database-url U -table rows
//	copier -path dedup       -brokers B -group G -in T -database-url U -table rows
//	copier -path raw         -brokers B -group G -in T -out T2 -instance 0
//	copier -path outbox      -brokers B -database-url U -in POSITIONS -instance 0
//	copier -path count       -brokers B -group G -in T -out T2 -changelog C -store memory|pebble [-state-dir D] [-restore-delay 8s] [-window 1m] -instance 0
//	copier -path count-naive -brokers B -group G -in T -out T2 -instance 0
//
// count counts the input by key (eos.Count), its store restored from the
// changelog C and changed in the processor's transaction, and emits one
// update per changed key per transaction to -out (eos.EmitUpdates); a pebble
// store lives in D/<instance>. It prints "copier: restoring [partitions]"
// to stderr whenever the partitions it restores change; -restore-delay
// slows each restore from the changelog's start. With -window, count
// counts per key and tumbling window of that size by record time, with a
// third of it as grace (eos.WindowedCount, kept a day). count-naive, the
// negative control, keeps its counts in a Go map outside the transaction
// and emits each new count to -out.
// outbox relays the outbox of the database at U (outbox.Relay, its default
// slot), keeping its position in the topic -in; the records name their own
// topics.
// raw is a plain franz-go transactional copier with no eoskit code, for the
// reproduction of the broker bug KAFKA-20734 (see raw.go).
//
// The database paths write one row per record (id, partition, offset) to
// -table, which has no unique constraint, so a duplicate is a second row.
// SIGTERM stops it cleanly. Exit status 3 means it was fenced (eos). It logs
// eoskit's warnings to stderr; -v logs eoskit at debug and kgo at info
// level.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/verify"
)

func main() {
	path := flag.String("path", "eos", "eos, offsetstore, dedup, raw, outbox, count or count-naive")
	brokers := flag.String("brokers", "", "Kafka bootstrap addresses")
	dbURL := flag.String("database-url", "", "PostgreSQL URL (database paths)")
	group := flag.String("group", "", "consumer group")
	in := flag.String("in", "", "input topic (outbox: the position topic)")
	out := flag.String("out", "", "output topic (eos; count: the updates)")
	changelog := flag.String("changelog", "", "count: the changelog topic")
	store := flag.String("store", "memory", "count: memory or pebble")
	stateDir := flag.String("state-dir", "", "count with -store pebble: the stores' root; the instance's are in <root>/<instance>")
	table := flag.String("table", "", "results table (database paths)")
	instance := flag.String("instance", "0", "stable instance name (eos transactional id)")
	session := flag.Duration("session-timeout", 6*time.Second, "group session timeout")
	verbose := flag.Bool("v", false, "log eoskit (debug) and kgo (info) to stderr")
	repair := flag.Bool("repair", true, "eos: write the markers of hanging transactions (single broker, KAFKA-20734); false keeps the default, detect and stop")
	delay := flag.Duration("record-delay", 0, "time the handler spends on each record, so that a run lasts long enough for its faults")
	windowSize := flag.Duration("window", 0, "count: count per tumbling window of this size by record time (grace: a third of it)")
	restoreDelay := flag.Duration("restore-delay", 0, "count: time a store's Reset takes more, so that a restore from the changelog's start lasts long enough for a rebalance to strike it")
	consumerProtocol := flag.Bool("consumer-protocol", false, "eos, offsetstore, dedup, count: join with Kafka's consumer group protocol (KIP-848)")
	concurrency := flag.Int("concurrency", 1, "handler calls at once: eos, one lane per input partition (eos.Concurrency); offsetstore and dedup, a transaction per partition")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// The client id names the instance in DescribeGroups, where the chaos
	// suite finds which copier owns which partitions.
	clientOpts := []kgo.Opt{kgo.SessionTimeout(*session), kgo.HeartbeatInterval(*session / 4), kgo.RebalanceTimeout(*session),
		kgo.ClientID("eoskit-copier-" + *instance)}
	// Warnings always reach stderr: the chaos suite counts what they
	// report (hanging transactions aborted, say).
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).
		With("copier", *instance, "pid", os.Getpid())
	if *verbose {
		// The instance and pid tell apart the copiers that share the
		// driver's stderr, including a zombie and its successor.
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).
			With("copier", *instance, "pid", os.Getpid())
		kgoLog := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).
			With("copier", *instance, "pid", os.Getpid())
		clientOpts = append(clientOpts, kgo.WithLogger(kslog.New(kgoLog)))
	}
	st := stateful{changelog: *changelog, store: *store, dir: stateDirOf(*stateDir, *instance), restoreDelay: *restoreDelay, window: *windowSize}
	err := run(ctx, *path, strings.Split(*brokers, ","), *dbURL, *group, *in, *out, *table, *instance, *delay, *repair, *concurrency, *consumerProtocol, st, logger, clientOpts)
	switch {
	case errors.Is(err, eos.ErrFenced):
		fmt.Fprintln(os.Stderr, "copier: fenced:", err)
		os.Exit(3)
	case err != nil:
		fmt.Fprintln(os.Stderr, "copier:", err)
		os.Exit(1)
	}
}

// stateful holds the count path's settings.
type stateful struct {
	changelog, store, dir string
	restoreDelay          time.Duration
	window                time.Duration // 0: by key alone
}

func run(ctx context.Context, path string, brokers []string, dbURL, group, in, out, table, instance string, delay time.Duration, repair bool, concurrency int, consumerProtocol bool, st stateful, logger *slog.Logger, clientOpts []kgo.Opt) error {
	if consumerProtocol && (path == "raw" || path == "outbox") {
		return fmt.Errorf("-consumer-protocol: path %s has no consumer group of eoskit's", path)
	}
	if path == "raw" {
		return rawCopy(ctx, brokers, group, in, out, group+"-"+instance, logger, clientOpts)
	}
	if path == "eos" || path == "count" || path == "count-naive" {
		txnID, err := eos.StableTransactionalID(group, instance)
		if err != nil {
			return err
		}
		opts := []eos.ProcessorOption{eos.Brokers(brokers...), eos.Group(group), eos.Topics(in), eos.TransactionalID(txnID),
			eos.CommitInterval(200 * time.Millisecond), eos.MaxRecordsPerCommit(750), eos.Concurrency(concurrency, eos.PartitionOrder),
			eos.Logger(logger), eos.ClientOptions(clientOpts...)}
		if repair {
			// The suite bounces a single broker, which Kafka 4.1-4.4
			// answers by dropping transaction markers (KAFKA-20734):
			// repair what that leaves hanging rather than stop.
			opts = append(opts, eos.OnHangingTransaction(eos.RepairHangingTransactions()))
		}
		if consumerProtocol {
			opts = append(opts, eos.ConsumerProtocol())
		}
		if path != "eos" {
			return countInputs(ctx, opts, st, out, instance, path == "count-naive", delay)
		}
		p, err := eos.NewProcessor(func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
			time.Sleep(delay)
			return []*kgo.Record{{Topic: out, Key: r.Key, Value: verify.CopyValue(r)}}, nil
		}, opts...)
		if err != nil {
			return err
		}
		return p.Run(ctx)
	}

	if path == "outbox" {
		return relay(ctx, brokers, dbURL, in, instance, logger, clientOpts)
	}
	poolCfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	// The application name shows the instance in pg_stat_activity, where
	// the chaos suite waits to catch it inside a transaction.
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "eoskit-copier-" + instance
	poolCfg.MaxConns = int32(max(4, concurrency+2))
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	insert := `INSERT INTO ` + pgx.Identifier{table}.Sanitize() + ` (id, part, off) VALUES ($1, $2, $3)`
	switch path {
	case "offsetstore":
		var proto []offsetstore.Option
		if consumerProtocol {
			proto = append(proto, offsetstore.ConsumerProtocol())
		}
		r, err := offsetstore.NewRunner(pool, func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
			for _, rec := range recs {
				time.Sleep(delay)
				if _, err := tx.Exec(ctx, insert, string(rec.Key), rec.Partition, rec.Offset); err != nil {
					return err
				}
			}
			return nil
		}, append(proto, offsetstore.Brokers(brokers...), offsetstore.Group(group), offsetstore.Topics(in),
			offsetstore.MaxRecordsPerCommit(750), offsetstore.Concurrency(concurrency), offsetstore.Logger(logger), offsetstore.ClientOptions(clientOpts...))...)
		if err != nil {
			return err
		}
		return r.Run(ctx)
	case "dedup":
		store, err := dedup.NewPostgresStore(table + "_ids")
		if err != nil {
			return err
		}
		if err := store.Migrate(ctx, pool); err != nil {
			return err
		}
		var proto []dedup.Option
		if consumerProtocol {
			proto = append(proto, dedup.ConsumerProtocol())
		}
		c, err := dedup.NewConsumer(pool, store, func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
			time.Sleep(delay)
			_, err := tx.Exec(ctx, insert, string(rec.Key), rec.Partition, rec.Offset)
			return err
		}, append(proto, dedup.Brokers(brokers...), dedup.Group(group), dedup.Topics(in), dedup.ID(dedup.KeyID()),
			dedup.MaxRecordsPerCommit(750), dedup.Concurrency(concurrency), dedup.Logger(logger), dedup.ClientOptions(append(clientOpts, kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...))...)
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
	return fmt.Errorf("unknown path %q", path)
}

// relay runs outbox.Relay on the database's outbox. Status every second:
// a standby takes over from a stalled relay within about 3 s.
func relay(ctx context.Context, brokers []string, dbURL, positions, instance string, logger *slog.Logger, clientOpts []kgo.Opt) error {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := outbox.NewRelay(pool, outbox.Brokers(brokers...), outbox.PositionTopic(positions),
		outbox.CommitInterval(200*time.Millisecond), outbox.MaxRecordsPerCommit(750), outbox.StatusInterval(time.Second),
		outbox.Logger(logger.With("relay", instance)), outbox.ClientOptions(append(clientOpts, kgo.TransactionTimeout(10*time.Second))...))
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
