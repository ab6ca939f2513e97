// Package offsetstore gives exactly-once processing for pipelines whose
// results live in PostgreSQL: each batch's results and the consumer's next
// offsets are written in one PostgreSQL transaction, and on every partition
// assignment the consumer positions itself at the offsets stored there, never
// at the offsets Kafka holds for the group.
//
// # Use
//
//	if err := offsetstore.Migrate(ctx, pool); err != nil { ... }
//	r, err := offsetstore.NewRunner(pool,
//		func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
//			for _, rec := range recs {
//				if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, $2)`, rec.Key, rec.Value); err != nil {
//					return err
//				}
//			}
//			return nil
//		},
//		offsetstore.Brokers("localhost:9092"),
//		offsetstore.Group("orders-loader"),
//		offsetstore.Topics("orders"))
//	err = r.Run(ctx)
//
// # What is guaranteed
//
// Every input record's results are committed to the database exactly once,
// across crashes (before, during or after the database commit), restarts,
// rebalances, zombie instances, lost database connections, and whatever
// Kafka holds as the group's committed offsets. Records of transactions
// that aborted upstream (an eos.Processor, Kafka Streams, Flink) are never
// applied: the consumer reads with read_committed, and an option that
// would read uncommitted data is refused. Assumptions:
//
//   - Every write of the handler goes through the pgx.Tx it is given, in the
//     database that holds eoskit_offsets. A write elsewhere (another
//     database, a service) is not rolled back with the offsets.
//   - Nobody else writes eoskit_offsets rows of the group.
//   - The handler is deterministic enough that redoing a rolled-back batch is
//     harmless; it may be called again with the same records.
//
// # Why a compare-and-set, and not the group generation
//
// Kafka's group generation tells a member that it was replaced only when it
// next talks to the group coordinator. An instance that paused (a long GC,
// a stalled handler, SIGSTOP) past its session timeout can still be inside a
// database transaction when it wakes up; by then the new owner of its
// partitions may already have read the stored offsets and committed further.
// No Kafka check inside the database transaction can be made atomic with the
// commit. So every batch's transaction first claims the offsets row of each
// partition it holds (SELECT ... FOR UPDATE, in a fixed order; a row not
// stored yet is created at the batch's first offset) and checks that it
// still holds the value this owner last read or wrote; only then does the
// handler run, and the offsets move to the batch's end. A stale owner is
// refused before any side effect, so its handler never fails on rows its
// successor wrote (a unique key, say) and no valid record is taken for a
// poison one; two owners of one partition queue on its row lock, and the
// second finds the row moved. Of two owners that both think they hold a
// partition, only the one whose view of the database is current can
// commit; the other's batch is refused ([Stats].StaleRejected counts
// these), and every partition the refused batch held, not only the
// contested ones, goes back to where the database stands, so that nothing
// after the refused records is skipped.
//
// # A topic deleted and created again
//
// Each stored offset carries its topic's ID (schema version 2). When a
// topic is deleted and created under the same name, the offset stored for
// the old one is not applied to the new one: the new topic is read from the
// reset point ([ResetOffset]) and its row replaced on the first commit.
// Rows stored before IDs were (version 1) are trusted, and get the ID on
// their next commit.
//
// # Errors, concurrency, shutdown, observability
//
// These work as in package eos, through one core: [OnHandlerError] takes
// [eoskit.Stop], [eoskit.Retry] (then a fallback) or [DeadLetter], which parks a record
// in eoskit_dead_letters in the transaction that stores its offset (see
// below how the record is found inside the batch's transaction).
// [eoskit.Classify] chooses among them by the handler's error: its rules ([eoskit.When]
// for errors.Is, [eoskit.WhenAs] for errors.As, [eoskit.WhenFunc]) are tried in order,
// the first that matches gives the policy, and the policy Classify is
// given applies to any other error; [eoskit.ErrorPolicy.For] tells which applies
// to an error without a broker. A panicking handler fails like one that
// returned an error; the record that stops Run is a *[eoskit.RecordError]
// (its offset not stored, so it is read again on the next start).
// [Concurrency] makes each partition a pipeline: its batches commit in
// database transactions of their own while the other partitions' records
// keep coming, a partition's records in order, up to n batches at once,
// with a backlog too. When
// Run's ctx ends, the batches under way (not those queued) finish and commit within
// [DrainTimeout]. [WithMetrics] takes the same [eoskit.Metrics] that eos's
// processors report to, and [Runner.Health] gives an [eoskit.Health] for
// probes. A refused ACL ends Run with an *[eoskit.AuthorizationError], a
// refused option or an unmigrated database with an *[eoskit.ConfigError]. Dead letters
// are logged as eos logs them: at Warn, coordinates and error only, never
// key or value, at most one line a second with a count of the others; and
// a runner assigned no partition for its session timeout and a margin says
// so once (see package eos).
//
// # A record that fails, inside its batch's transaction
//
// A handler that fails has its writes rolled back, but not the batch's
// transaction: each call of the handler runs under a savepoint (the first
// taken in the round trip that claims the offsets rows, the next ones by
// RELEASE and SAVEPOINT in one round trip after a call that succeeded),
// and a call that fails rolls back to it. The record at fault is then
// found without leaving the transaction:
//
//   - A handler that returns [Reject](rec, err) names it. The handler runs
//     again on the records before it, the policy applies to it, and the
//     handler runs on the records after it: a rejection costs two calls,
//     no search. A record that was not among those the handler was given
//     (nil, another batch's) stops Run with [ErrRejectedOutsideBatch]:
//     the runner does not guess around a handler's bug.
//   - A handler that names nothing (an error, a panic) has its records
//     split in halves, each run under a savepoint of its own, down to the
//     record that fails alone: about 2·log2(n) calls per bad record in a
//     batch of n.
//
// [DeadLetter] parks the record in the transaction and the batch goes on;
// the batch then commits once, with its offsets, its good records'
// results and its dead letters ([Stats].Batches counts one transaction).
// [eoskit.Stop] commits the records before the one stopped on, with their
// offsets, and Run returns the *[eoskit.RecordError]. A [eoskit.Retry] with attempts
// left rolls the whole transaction back (its row locks are not held
// through the pause), pauses, and runs the batch again, counting each
// record's failures across the runs; its fallback, once the attempts are
// spent, is settled in the transaction like DeadLetter or Stop. A record
// parked in a run that then rolled back is parked again in the next
// without calling its handler. The handler must therefore bear being
// called again on part of its batch within one transaction, after a
// rollback to a savepoint: state it keeps outside the database is not
// rolled back with it.
//
// What it costs: one round trip per handler call for its savepoint (none
// for the first); a call that fails costs a round trip to roll back
// (which also tells a record's failure from the database's: a connection
// closed or silent fails it) and its records' rerun. A handler that fails
// leaving rows open on the connection loses the attempt (no statement can
// follow): the record's failure is counted all the same and settled in
// the next attempt, which, when the handler named no record, calls it one
// record at a time. Every savepoint whose call wrote takes a subtransaction
// id; PostgreSQL keeps at most 64 per backend in shared memory, and past
// them every snapshot taken on the server while the transaction is open
// must read pg_subtrans (a known slowdown of concurrent reads). A clean
// batch takes one, a rejected record one more, but a bisection about two
// per bad record per level of the split: with many bad records per batch
// and a handler that names none, keep batches small ([MaxRecordsPerCommit]) or
// name the record with Reject. An error that is the database's doing
// during any of this (see below) is never blamed on a record: the whole
// transaction is retried.
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
// connection (closed, or failing the rollback), never by waiting for
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
// *pgconn.PgError. The batch rolls back and runs again
// like one whose commit failed, with a growing pause, up to 10 times
// before Run returns the error. The claim of the offsets rows waits at
// most 10 s for another owner's lock; that bound ends with the claim, and
// the handler's statements wait on locks as long as the connection's own
// lock_timeout lets them (none by default).
//
// # Kafka's offsets
//
// The consumer never commits to Kafka by default and never reads Kafka's
// committed offsets. [MirrorToKafka] copies the stored offsets to the group
// after each database commit, best effort, for tools that show lag from
// Kafka; the copies are never read back.
package offsetstore
