// Package dedup makes an at-least-once Kafka pipeline apply each message's
// side effect once: the consumer claims the message's unique id with an
// INSERT ... ON CONFLICT DO NOTHING in the same PostgreSQL transaction as the
// side effect, and skips ids it has already claimed.
//
// # Use
//
// On the producer side, give each message its id once, where it originates:
//
//	cl.Produce(ctx, dedup.Stamp(&kgo.Record{Topic: "payments", Value: v}), nil)
//
// On the consumer side, write the side effect through the transaction the
// handler is given:
//
//	store, _ := dedup.NewPostgresStore("")
//	_ = store.Migrate(ctx, pool)
//	c, err := dedup.NewConsumer(pool, store,
//		func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
//			_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2`, amount(r), account(r))
//			return err
//		},
//		dedup.Brokers("localhost:9092"), dedup.Group("ledger"), dedup.Topics("payments"))
//	err = c.Run(ctx)
//
// # What is guaranteed
//
// Each message id's side effect is committed exactly once per scope,
// whatever the copies of the message in the topic (a producer retry after a
// lost acknowledgement, the same message sent twice), whatever the
// redeliveries (a crash between the database commit and the Kafka offset
// commit, a rebalance, an offset reset, a replay), and whatever the number
// of consumers racing on the same ids in one scope. Records of transactions
// that aborted upstream are never applied: the consumer reads with
// read_committed, and an option that would read uncommitted data is
// refused. Assumptions:
//
//   - Copies of a message carry the same id, and different messages
//     different ids: [Stamp] once at the origin, or a natural key ([KeyID],
//     [HeaderID], or your own [IDFunc]).
//   - Every write of the handler goes through the given pgx.Tx. A call to
//     another service, or a write through another connection, is not rolled
//     back with the claim and may happen more than once.
//   - A copy arrives within the retention horizon: ids purged by
//     [PostgresStore.Purge] are forgotten, and a copy arriving later is
//     applied again. Choose the horizon above the longest redelivery delay
//     you can have: maximum consumer lag, the time to notice and fix an
//     outage, any replay from an earlier offset or a backup.
//
// Records are not deduplicated in Kafka: the topic keeps its copies and
// other consumers see them. Order is Kafka's per partition; a skipped copy
// does not reorder anything.
//
// A consumer that stalls past its session timeout (a long GC, SIGSTOP)
// while a batch is under way may commit that batch after the group gave
// its partition to another consumer: the ids it claimed are taken, so
// the new owner skips them. Kafka takes none of that batch's offsets, and the
// consumer logs a warning: of the offset commit Kafka refused, or, under
// [Concurrency] above 1 when the lost session is noticed first, one that
// names the batch ("a batch of a partition taken from this member
// committed").
//
// # Errors, concurrency, shutdown, observability
//
// These work as in package eos, through one core: [OnHandlerError] takes
// [eoskit.Stop], [eoskit.Retry] (then a fallback) or [DeadLetter], which parks a record
// in eoskit_dead_letters in the transaction that claims its id (so a later
// copy is skipped). [eoskit.Classify] chooses among them by the handler's error:
// its rules ([eoskit.When] for errors.Is, [eoskit.WhenAs] for errors.As, [eoskit.WhenFunc]) are
// tried in order, the first that matches gives the policy, and the policy
// Classify is given applies to any other error; [eoskit.ErrorPolicy.For] tells
// which applies to an error without a broker. A panicking handler fails
// like one that returned an error; the record that stops Run is a
// *[eoskit.RecordError] (Err is the handler's error, [ErrMissingID] or
// [ErrIDTooLong]). [Concurrency] makes each partition a pipeline: its
// batches commit in database transactions of their own while the other
// partitions' records keep coming, a partition's records in order, up to
// n batches at once, with a backlog too. When Run's ctx ends, the batches under way (not those queued)
// finish and commit within [DrainTimeout]. [WithMetrics] takes the same
// [eoskit.Metrics] that eos's processors report to, and [Consumer.Health]
// gives an [eoskit.Health] for probes. A refused ACL ends Run with an
// *[eoskit.AuthorizationError], a refused option or an unmigrated
// database with an *[eoskit.ConfigError]. Dead letters are logged as eos logs them: at Warn, coordinates
// and error only, never key or value, at most one line a second with a
// count of the others; and a runner assigned no partition for its session
// timeout and a margin says so once (see package eos).
//
// # A record that fails, inside its batch's transaction
//
// A batch first runs as one plain transaction, with no savepoint: a clean
// batch costs what it did before. The first handler failure in a batch
// rolls it back whole; from then on that batch runs with savepoints: one
// taken before its first record and taken again (RELEASE and SAVEPOINT in
// one round trip) every 16 handler calls, or more in a batch over 768
// records so that it takes at most 48. A record that fails and is to be
// parked ([DeadLetter], or a [eoskit.Retry]'s DeadLetter fallback once its
// attempts are spent) rolls back to the savepoint; the records since run
// again, it is parked in their place, claim included, and the batch goes
// on and commits once. k bad records in a batch thus cost two runs of it
// (the plain one up to the first failure, then one with savepoints) and at
// most a chunk's rerun each, instead of k+1 runs. [eoskit.Stop], and a Retry
// with attempts left, roll the whole transaction back as before (the
// Retry pauses with no lock held, then runs the batch again); a record
// parked in a run that rolled back is parked again in the next without
// its handler. The handler must bear being called again on a record
// after a rollback to a savepoint, within one transaction: state it keeps
// outside the database is not rolled back with it.
//
// What it costs: a batch that met a failure pays its plain run up to the
// failure, one round trip per chunk of 16 calls, and per bad record a
// round trip to roll back (which also tells a record's failure from the
// database's) and the chunk's rerun, about 8 calls. Each chunk that wrote
// and each park takes a subtransaction id: PostgreSQL keeps at most 64 per
// backend in shared memory, and past them every snapshot taken on the
// server while the transaction is open must read pg_subtrans (a known
// slowdown of concurrent reads); 48 chunks at most keep a batch under that
// unless it parks more than 16 records. An error that is the database's
// doing during any of this (see below) is never blamed on a record: the
// whole transaction is retried.
//
// A dead letter keeps the record's key and value as bytes, as they came,
// and the error's text with each NUL byte, and each run of bytes that are
// not UTF-8, replaced by U+FFFD: PostgreSQL's text refuses them, and the
// record could not be parked otherwise.
//
// A handler's error that is the database's doing rather than the record's
// (a lost connection, a server shutting down, a deadlock, a serialization
// failure, a lock wait that timed out, a statement cancelled by
// statement_timeout or pg_cancel_backend) is never blamed on a record, and
// is told from the database's own signals and from the transaction's own
// connection (closed, or not answering a ping), never by waiting for
// another connection of the pool, which may all be in use. That holds
// whoever raised it, the handler or the runner, and comes before the error
// policy: no rule of a [eoskit.Classify] sees it, and a Stop fallback does not
// stop on it. The database's error is found with errors.As (a
// *pgconn.PgError and its SQLSTATE: 40001, 40P01, 55P03, 57014 (but
// not COPY's, whose rows the record gave), class 08, 53 or 57P), so a
// handler must wrap it with %w; wrapped with %v, only a closed or silent
// connection still tells. An error pgconn made without the database's word
// (a deadline of the handler's own used up, a pool of the handler's own
// that cannot connect) is the record's, as a handler's own calls make
// them; the runner's connection that broke under the handler is told from
// the connection itself. The shape of an error is never read: a
// *net.OpError from an enrichment call, io.EOF from a decoder or a
// context.DeadlineExceeded of the handler's own is the record's, and its
// error policy decides (before, each was taken for the database's). A
// record whose statement is always slower than the role's
// statement_timeout is retried as a wait until Run ends: raise the
// timeout, or have the handler tell that record apart. A second pool of
// the handler's own that reports a SQLSTATE of these classes is taken for
// this database's: wrap its errors so that they do not unwrap to a
// *pgconn.PgError. The batch rolls back and runs again,
// with a growing pause, up to 10 times before Run returns the error.
//
// [MemoryStore] is a process-local, bounded alternative with a much weaker
// guarantee; its documentation says exactly how weak.
package dedup
