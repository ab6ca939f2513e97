// Package eos gives Kafka-to-Kafka exactly-once processing on franz-go:
// delivery-semantics presets, idempotent and transactional producers, and a
// consume-transform-produce loop that commits its consumed offsets inside the
// Kafka transaction that carries its output.
//
// # Delivery semantics
//
// [AtMostOnce], [AtLeastOnce] and [ExactlyOnce] are presets of franz-go
// options ([Semantics.ProducerOptions], [Semantics.ConsumerOptions]).
// Constructors check the effective client configuration against the chosen
// semantics and refuse a contradiction (acks=1 under exactly-once, a
// transactional id without idempotence, auto-commit with exactly-once) with a
// *[eoskit.ConfigError] naming the setting; [Semantics.Check] does the same for a
// client you build yourself.
//
// Options are typed by the constructors that use them, as kgo's are: an
// option a constructor cannot use does not compile there
// ([IdempotentOption], [TransactionalOption], [ProcessorOption]; [Option]
// fits all three).
//
// # Producers
//
// [IdempotentProducer] writes each record once per partition, in order,
// whatever the retries. [TransactionalProducer.Transact] makes writes to any
// topics and partitions atomic, in the shape of pgx's BeginFunc:
//
//	err := p.Transact(ctx, func(tx *eos.Tx) error {
//		tx.Produce(&kgo.Record{Topic: "orders", Value: order})
//		tx.Produce(&kgo.Record{Topic: "audit", Value: entry})
//		return nil
//	})
//
// It commits only if the function returned nil and every record was
// acknowledged; otherwise it aborts and returns an error wrapping
// [ErrAborted] and the cause.
//
// # The processor
//
// [Processor] consumes input topics in a group, calls a [HandlerFunc] for
// each record, and commits the handler's outputs together with the input
// offsets in one transaction, every [CommitInterval] or
// [MaxRecordsPerCommit] records:
//
//	p, err := eos.NewProcessor(handler,
//		eos.Brokers("localhost:9092"),
//		eos.Group("enricher"),
//		eos.Topics("orders"),
//		eos.TransactionalID(txnID), // from StableTransactionalID
//	)
//	err = p.Run(ctx)
//
// A handler that fails (or panics) follows [OnHandlerError]: [eoskit.Stop] (the
// default), [eoskit.Retry] a number of times and then a fallback, or
// [DeadLetter]. [Concurrency] runs handler calls at once, in lanes per
// partition or per key, each keeping its inputs' order, inside the same
// transaction. When Run's ctx ends, the processor stops polling, handles
// what it polled and commits it, all or nothing, within [DrainTimeout]
// (past it, the transaction aborts). offsetstore
// and dedup take options of the same names and meanings.
//
// # What is guaranteed
//
// For every input record, the outputs of exactly one handler call are
// visible to read_committed readers, and the input's offset is committed in
// the same transaction; outputs of one input partition appear in input order
// within each output partition (under [Concurrency] with [KeyOrder], of one
// key only). This holds across crashes of the processor
// (a Processor registers its transactional id before it consumes, which
// aborts the transaction a dead predecessor left open; its pending offset
// commit would otherwise hold the group's partitions until the transaction
// timeout), broker restarts (the processor looks for hanging transactions
// Kafka may leave behind after one and stops before joining one, see
// [HangingTransactionCheck] and [OnHangingTransaction]), rebalances (a batch
// that straddles a revocation is aborted and read again by the new owner),
// and zombies (an instance that wakes after its successor started is fenced
// and stops with [ErrFenced]).
//
// It rests on these assumptions, each of which a user can break:
//
//   - Readers of the output read with read_committed
//     (kgo.FetchIsolationLevel(kgo.ReadCommitted())). A read_uncommitted
//     reader sees the records of aborted transactions.
//   - Transactional ids are stable per instance and unique among running
//     instances ([StableTransactionalID]). A random id per start fences
//     nothing and leaves hanging transactions behind.
//   - A transaction finishes well within the transaction timeout
//     (kgo.TransactionTimeout, default 40s). The processor gives each
//     transaction a budget of three quarters of it, and the handler a ctx
//     that ends with the budget: when the budget runs out before the polled
//     records are handled, it aborts the transaction itself (before the
//     broker would) and takes fewer records per transaction, down to one,
//     then more again while transactions end within half the budget. A
//     record whose handler gives up with the ctx's error twice while alone
//     in its transaction fails with [ErrHandlerTooSlow] and follows the
//     error policy. A handler that ignores its ctx and runs past the
//     timeout gets its transaction aborted by the broker; the processor
//     restarts its session with half as many records per transaction, and
//     restarts again for as long as one record's handler alone outlives the
//     timeout. The broker's abort bumps the epoch, which reads like
//     fencing: the processor restarts only when the transaction
//     coordinator shows this transaction aborted and nobody registered the
//     id since (a zombie woken past its timeout after its successor started
//     stops with [ErrFenced], leaving the successor alone).
//     [TransactionalProducer.Transact]
//     likewise returns [ErrTransactionTimedOut], and stays usable.
//   - The handler's only effect is the records it returns. It may run more
//     than once for one input (after an abort); effects outside Kafka are
//     not covered (use package offsetstore or dedup for database effects).
//   - The broker supports KIP-447 (Kafka 2.5+); eoskit is tested on Apache
//     Kafka 4.4 with transaction protocol v2 (KIP-890).
//
// The weaker semantics run the same loop with [WithSemantics]: AtLeastOnce
// commits offsets after its outputs are acknowledged (a crash in between
// duplicates), AtMostOnce before it handles the records (a crash loses them).
//
// # Keyed state
//
// [Changelog] gives a processor a key-value store per input partition
// ([StateOf] inside the handler), as Kafka Streams' state stores under
// exactly_once_v2: a transaction's changes (each changed key's final
// value) are produced to the changelog partition of the input's number
// in the transaction that commits the outputs and the offsets, and
// applied to the store only once it committed. [Count], [Sum] and
// [Reduce] are the aggregations, and [EmitUpdates] their output: one
// record per changed key per transaction. [Processor.State] reads the
// committed state while Run works (an HTTP handler may call it). [TTL]
// deletes keys no record has written for a while of stream time, in the
// transaction. The aggregations count a key whole only when the input is
// partitioned by it: [NewGrouped] aggregates by a key derived from each
// record through a repartition topic, and [RequireKeyPartitioning]
// refuses input that is not partitioned by its keys.
//
// [WindowedCount], [WindowedSum] and [WindowedAggregate] aggregate by key
// and event-time window (package window: tumbling and hopping windows,
// grace, retention), each partition's stream time kept in its store;
// [EmitFinal] emits a window's result once it closes; [StateView.Windows]
// reads a key's windows. [SessionCount], [SessionSum] and
// [SessionAggregate] do the same per session of activity (window.Sessions:
// an inactivity gap and a grace), merging sessions a record bridges. A
// [GlobalTable] ([WithGlobalTables]) holds a small compacted topic whole
// on every instance for lookups, restored before the first record. A
// co-partitioned [Table] ([WithTables]) is materialized in each
// partition's state, and [JoinTable] joins each record with it as of the
// record's time, exactly once (the stream–table join). See docs/state.md.
//
// What holds: a handler reads its own transaction's writes; a record that
// fails leaves none (its call's writes are dropped, see [StateOf]); an
// aborted transaction leaves the store as the last committed one left it;
// before a newly assigned partition's first record is handled (its
// records are not fetched meanwhile, while the other partitions go on),
// its store is restored from the changelog, read_committed, up to the high watermark
// listed when the restore starts, once the transactions open below it
// ended (the previous owner's last commit may reach the changelog after
// its offsets). A changelog missing, not compacted or with another
// partition count is refused at Run with a *[eoskit.ConfigError].
//
// What breaks it: anything but this processor writing to the changelog;
// adding partitions to the input or the changelog (a key's state then
// lives in another partition); under [Concurrency] with [KeyOrder],
// handlers writing keys other than their record's (two lanes may then
// write one key in either order); a handler keeping state of its own
// outside [StateOf] (it survives aborts). A restore waits for a
// transaction left open on the changelog until the broker aborts it at
// its timeout, up to [RestoreTimeout]. A store is closed when its
// partition is taken away and with every session; the in-memory store
// (the default) is then restored whole at the next assignment, while
// [github.com/eoskit/eoskit/state/pebblestore.Factory] keeps it on disk with the changelog offset it
// holds, so that only the tail is read. See docs/state.md.
//
// # Errors
//
// Test errors with errors.Is and errors.As: [ErrFenced] (final),
// [ErrAborted], [ErrOutcomeUnknown], [ErrTransactionTimedOut] (with
// ErrAborted; retry), [ErrClosed], *[ProduceError] (wraps the Kafka
// error), *[DeadLetterError], *[HangingTransactionError]. The errors every
// runner shares are package eoskit's: *[eoskit.ConfigError] (wrapping
// [eoskit.ErrInvalidConfig]), *[eoskit.RecordError] (names topic,
// partition, offset and attempts), *[eoskit.AuthorizationError] (names the
// ACL to grant) and [eoskit.ErrRunning].
//
// # Error policies, classified by error
//
// [OnHandlerError] says what happens to an input whose handler fails:
// [eoskit.Stop] (the default), [eoskit.Retry] (then [eoskit.Stop] or [DeadLetter]) or
// [DeadLetter]. [eoskit.Classify] chooses among them by the error, as Spring
// Kafka's error classifier does: rules made by [eoskit.When] (errors.Is),
// [eoskit.WhenAs] (errors.As) and [eoskit.WhenFunc] are tried in order, and the first
// that matches gives the policy; the policy Classify is given applies to
// any other error:
//
//	eos.OnHandlerError(eoskit.Classify(eoskit.Stop(),
//		eoskit.When(ErrParse, eos.DeadLetter("orders-dlq")),
//		eoskit.When(context.DeadlineExceeded, eoskit.Retry(100*time.Millisecond, 5)),
//	))
//
// [eoskit.ErrorPolicy.For] tells which policy applies to an error, without a
// broker. An input dead-lettered in a transaction that then aborts (for
// another input's failure) is dead-lettered again without its handler
// running: a record whose error is dead-lettered is handled once. Rules
// may dead-letter to different topics; Run checks at its start that each
// exists.
//
// # Observability
//
// [Logger] takes a *slog.Logger (default slog.Default()). Each dead letter
// is logged at Warn with its input's coordinates (topic, partition,
// offset) and the error's text (cut at 300 bytes), never its key or value,
// at most one line a second: the dead letters held back meanwhile are
// counted in one line, with the coordinates of the last, once the second
// has passed or when Run returns. A processor whose group assigns it no
// partition for the longer of its session and rebalance timeouts plus a
// quarter of it (at least 5 s more: 75 s under franz-go's defaults of 45
// and 60 s) logs it once at Warn, with
// the likely reasons (another member holds the partitions until its
// session timeout expires, or the group has more members than
// partitions). [WithMetrics]
// takes an [eoskit.Metrics], for which package eos/eosprom has a Prometheus
// implementation that offsetstore's and dedup's runners share, labelled
// by path. [Processor.Health] gives an [eoskit.Health]: assigned partitions, last commit, last
// error and lag, for probes. franz-go's own client metrics come from
// plugin/kprom, and tracing from plugin/kotel, through [ClientOptions]:
// an output keeps the Context its handler set, so its span joins the
// input's trace.
package eos
