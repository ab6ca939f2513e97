// Package outbox publishes records from PostgreSQL to Kafka exactly once:
// the transactional outbox, with a relay that neither loses nor
// republishes whatever it crashes.
//
// A service that must change its database and publish an event can not
// write to both in one transaction (a dual write loses or invents events).
// With outbox it writes the event to an outbox table inside its own
// database transaction:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE orders SET state = 'paid' WHERE id = $1`, id); err != nil {
//			return err
//		}
//		return outbox.Write(ctx, tx, &kgo.Record{Topic: "orders", Key: []byte(id), Value: event})
//	})
//
// and a [Relay] publishes it:
//
//	r, err := outbox.NewRelay(pool, outbox.Brokers("localhost:9092"))
//	...
//	err = r.Run(ctx) // until ctx ends or a final error
//
// # What it guarantees
//
// Every record of a committed database transaction reaches Kafka once (as
// read by read_committed consumers); no record of a rolled-back one ever
// does. Records are published in the commit order of the transactions that
// wrote them (and in the order written within one), so records of one key
// (which go to one partition) keep the order their transactions
// committed in. Each record's Kafka timestamp is its transaction's commit
// time.
//
// # How: logical decoding, and the position in Kafka
//
// The relay reads the outbox table's inserts from PostgreSQL's
// write-ahead log through a logical replication slot and the built-in
// pgoutput plugin (github.com/jackc/pglogrepl). The log gives whole
// committed transactions in commit order, which is the order the guarantee
// needs; a poller by id or by sequence can not have it (an id taken
// earlier may commit later, and a poller that moved past it skips it for
// good), and transaction-id snapshots (xid8) give the order transactions
// started, not committed. Rolled-back transactions never appear in the
// stream.
//
// The relay publishes several database transactions (never part of one)
// in one Kafka transaction, and adds to it a record of its position (the
// log position where the last of them ended) in a position topic, so that
// records and position commit together. Every session (each start, and
// each restart after a failure) first takes the slot (PostgreSQL lets one
// session read it), then registers its transactional id with a fresh
// producer (which fences any other relay with it and aborts that relay's
// open transaction), then reads its position back: the last record under
// its key that a committed transaction wrote (it reads the topic to its
// end and decides by the transaction markers, so a transaction another
// slot's relay has open on a shared topic does not hold it up; one still
// open under its own key, a relay of this slot under another
// transactional id, or a hanging transaction, is waited for up to a
// minute, then fails the read with [ErrPosition]).
// The slot streams from its own confirmed position, which is never past
// the one in Kafka, and the relay skips what Kafka already has. The slot
// is told a position only after Kafka committed it; until then PostgreSQL
// keeps the log. So a crash at any point leads to a restart from exactly
// what Kafka has: nothing twice, nothing skipped. The position is kept
// under the server's system identifier and the slot's name, and a
// position past the server's log is refused ([ErrPosition], [ErrRewound]):
// a restored or re-created server never inherits another's. The rows are deleted
// from the table as they are published (before the Kafka commit: the
// log, not the table, is what is replayed). A row whose transaction the
// log gave before other sessions could see it (a moment usually; under
// synchronous replication, until a synchronous standby acknowledged the
// commit) is deleted later: every position record names the published
// rows not deleted yet, and the relay, and whichever relay reads that
// position next, deletes them with the next batches, when a session
// starts and every [StatusInterval] (at most 1,000 ids a statement),
// until they are gone. An at-least-once relay, which keeps no position,
// remembers them only while it runs.
//
// # What it needs
//
//   - PostgreSQL 14 or newer, with wal_level = logical (scripts/postgres.sh
//     sets it). [Migrate] and [Relay.Run] refuse to start otherwise, with
//     [ErrWALLevel].
//   - A role with the REPLICATION attribute for the relay and [Migrate] (to
//     create and read the slot) that owns the outbox tables (so [Migrate]
//     can create them and the publication). No superuser, and no
//     pg_read_all_stats: the relay holding the slot beats in a table of
//     its own, which standbys watch.
//   - [Migrate] run before the first [Write]: it creates the outbox's
//     table, its publication and its slot ([DefaultSlot], or the one
//     [Slot] names), and nothing else; records written before the slot
//     existed are never relayed.
//   - The position topic ([DefaultPositionTopic] unless [PositionTopic])
//     created beforehand: one partition, cleanup.policy=compact; and the
//     [DeadLetter] topic, if one is set. [Relay.Run] looks both up when it
//     starts (a Metadata request: Describe, which Read or Write implies)
//     and returns an *eoskit.ConfigError naming the setting if one is
//     missing, or has gone since (a produce to it refused as
//     UNKNOWN_TOPIC_OR_PARTITION): the relay never creates topics. The
//     relay's Kafka principal needs Write on the output topics and the
//     position topic, Read on the position topic, and Write and Describe on
//     its transactional id; nothing cluster-wide.
//
// # Several services in one database
//
// Each service names its outbox with [Name], and gives the same name to
// [Migrate], to the [Writer] that writes its records and to its [Relay]:
//
//	billing := outbox.Name("billing")
//	err := outbox.Migrate(ctx, pool, billing)
//	w, err := outbox.NewWriter(billing) // w.Write(ctx, tx, records...) in the service's transactions
//	r, err := outbox.NewRelay(pool, billing, outbox.Brokers("localhost:9092"))
//
// The outbox then has a table (eoskit_outbox_billing), a publication and
// a replication slot of its own, so its relay reads, publishes and
// deletes only its rows, and its position (keyed by the slot) and
// transactional id differ from every other relay's; the relays of one
// database may share a position topic. Without a name a service uses the
// default outbox ([Table], [Publication], [DefaultSlot]), as eoskit always
// did: existing deployments keep their tables, slot and position. A name
// is checked where it is given (an *eoskit.ConfigError, before anything
// reaches the server); see [Name] for what it may hold.
//
// # What breaks it
//
//   - Dropping the slot, or advancing it by hand, loses whatever it held;
//     so does a server that invalidates it (max_slot_wal_keep_size, or a
//     slot timeout on newer servers) while the relay is down. A slot
//     nobody reads keeps the log growing on the server: drop the slots
//     you no longer use ([DropSlot]).
//   - A failover to a replica: PostgreSQL 15 does not copy logical slots,
//     so records committed between the old slot's position and the new
//     slot's creation are not relayed.
//   - Rows written other than with [Write] (malformed headers, no topic)
//     stop the relay, and only advancing the slot past them, which loses
//     them, lets it go on.
//   - Deleting the position topic stops the relay (an *eoskit.ConfigError);
//     re-creating it (or deleting the relay's key in it) makes the next
//     relay start from the slot's own position, which may be up to one
//     batch behind: those records are published again.
//   - Two relays of one slot with different transactional ids do not fence
//     each other. Give every relay of a slot the same id (the default).
//   - Two outboxes read through one slot ([Slot] naming the same for
//     both): they share a position, so each relay skips what the other
//     published. Give each outbox its own slot (the default).
//   - A writer and a relay given different names: the records go to an
//     outbox the relay does not read.
//
// # Faults
//
// Connection failures, restarts of PostgreSQL or Kafka brokers and
// aborted transactions are retried: every retry resumes from the position
// committed in Kafka. A relay that started beside a live one stands by
// until it stops or goes quiet (no heartbeat for three status intervals,
// 30 s by default), then ends its session on the slot and takes over,
// fencing it in Kafka; woken, the stalled relay either finds itself
// fenced (Run returns an error wrapping eos.ErrFenced) or stands by. A
// record Kafka refuses as its own fault (too large, invalid), one
// pinned with [WriteToPartition] to a partition its topic lacks (as a
// fresh metadata look-up confirms), or one addressed as a relay's
// position (to the relay's position topic, or keyed "<system id>/..." as
// position records of this database are: [ErrPositionRecord], so that no
// service's writer can forge another's position), stops the relay with a
// *[RecordError] at once, or goes to the [DeadLetter] topic. To find which
// record it was when Kafka refused a whole produce batch, the relay
// takes the batch's database transactions one at a time, and first
// probes a transaction's records in Kafka transactions it aborts (500
// records produced together, a refused 500 again one at a time), each of
// at most 5,000 records and a quarter of the transaction timeout, so
// that no Kafka transaction outlives its timeout however large the
// database transaction; then it publishes the transaction, the refused
// records dead-lettered (should Kafka refuse it again, one record at a
// time). What the probes found, and how far they went, outlives a
// session that ends meanwhile. A record for a missing topic, or refused for its timestamp (the
// relay stamps records with their commit time, which a topic's
// message.timestamp.*.max.ms may refuse for a whole backlog), or pinned
// to a partition that the relay's producer does not know yet but the
// topic has (partitions just added: the next session's producer loads
// them), is retried for [RetryFor], then stops the relay with a
// *[RecordError]. While the relay waits for Kafka (a broker unreachable,
// a slow commit) it keeps its replication session alive, so that
// PostgreSQL's wal_sender_timeout does not end it, for up to the
// transaction timeout (kgo.TransactionTimeout, 40 s by default); a relay
// stuck longer lets the session lapse, so that a standby can take over. A
// transaction the coordinator ended at its timeout (which fences its
// producer) starts a new session with a new producer, as does any
// fencing while no other relay holds the slot (only a relay that took
// the slot fences another). The position in
// Kafka carries the slot's incarnation token: a position of an earlier
// slot of the same name (a server restored from a backup, which keeps no
// slots, and its slot re-created) is ignored, and one from another server
// is under another key. Either way
// the record stays in the log, and the relay publishes it, in order, on
// its next start.
//
// # A database restored from a backup
//
// A restore (a base backup, a volume snapshot, a point-in-time recovery,
// a failover to a replica behind) brings back the slot and its token as
// they were, while Kafka's position is past the restored log. New
// transactions then take the stretch of log the published ones had: taken
// for published, they would be skipped. So each position in Kafka names
// the transaction it ends with (its id and commit time), and a relay whose
// slot streams from below the position checks that the log still holds
// that transaction there; until it has, the slot is told nothing. A log
// that holds another there, or none, is rewound: Run stops with
// [ErrRewound], naming both, and publishes nothing. A position past the
// server's log is refused alike. The operator tells the relay where the
// restored log ends ([Relay.ResumeAfter], or eoskit's command: go run
// github.com/eoskit/eoskit/cmd/eoskit outbox resume-after -lsn ...): a
// point-in-time recovery's target LSN; for a backup or a snapshot, its last
// checkpoint (pg_controldata's "Latest checkpoint location" of the restored
// data, or SELECT checkpoint_lsn FROM pg_control_checkpoint() before the
// server takes new writes), which is at or before the true end: a point
// before it publishes again what lies between (duplicates, never a loss).
// The relay's
// next run publishes every transaction that ends past that point. The
// records the restore lost stay in Kafka. Positions written before this
// check was kept carry no transaction to check: a relay reading one
// checks from its next publish on.
//
// [WithSemantics](eos.AtLeastOnce) makes a relay of the common kind
// (acknowledged, then the slot told): a crash between the two publishes
// again. It exists to compare with: the tests show its duplicates under
// the crashes the exactly-once relay survives without any.
package outbox
