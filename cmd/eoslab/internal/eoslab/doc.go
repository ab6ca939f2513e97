// Package eoslab is the lab behind cmd/eoslab: it runs the reference
// patterns (package patterns and its subpackages) and weaker designs
// beside them on one workload (regional case reports summed into
// per-region totals), through the same faults, and verifies what each
// produced, so that what each guarantees, and what each loses or
// duplicates, can be compared side by side.
//
// The rows, in the table's order:
//
//   - at-most-once (a control): a producer that gives up on an unknown
//     outcome, and eos.Processor with eos.AtMostOnce (offsets committed
//     before processing). Loses. It can also duplicate: a member stalled
//     past its session timeout may, once its client has rejoined the
//     group, commit and process records of a partition the group has
//     meanwhile given to another member, since a classic group's offset
//     commit checks the generation, not who owns the partition. The lab's
//     zombie shows it.
//   - at-least-once (a control): a producer that resends, and
//     eos.Processor with eos.AtLeastOnce (offsets committed after the
//     outputs are acknowledged). Duplicates.
//   - kafka→kafka, totals in a map (a control): the pattern kafkatokafka,
//     its outputs exactly once, with the totals kept in a Go map the
//     handler updates, outside the transaction, each new total published
//     with the outputs. Its totals come out wrong: a batch that aborts and
//     is handled again adds twice, and an instance that restarts, or is
//     given a partition, starts from nothing.
//   - exactly-once kafka→kafka: the pattern kafkatokafka (outputs and
//     offsets in one transaction), fed by the resume producer, with the
//     totals in Kafka (Config.Totals: eos.Sum in keyed state whose
//     changelog commits in the transaction, one update per changed region
//     per transaction).
//   - exactly-once kafka→postgres: the pattern kafkatopostgres (rows and
//     offsets in one database transaction), fed by the resume producer.
//   - effectively-once with dedup: a resending producer that stamps message
//     ids, and the pattern dedupconsumer.
//   - exactly-once producer resume: one producer per partition that, after an
//     unknown outcome or a crash, reads its partition's last record to
//     decide whether to resend.
//   - at-least-once outbox relay (a control): the pattern outboxrelay with
//     eos.AtLeastOnce, crashed twice after Kafka acknowledged a batch and
//     before the slot was told. Duplicates.
//   - exactly-once outbox relay: the pattern outboxrelay, crashed the same
//     way with its Kafka transaction open.
//
// Totals correct compares the dashboard's totals with the workload's: for
// the two Kafka rows that keep totals, each region's last value on their
// totals topic, read_committed; for the other Kafka rows, the sum of the
// reports a read_committed reader of the feed sees; for the database rows,
// the totals table. A control whose totals came out right in a run is
// reported "not shown" (the faults missed this time), never "yes".
//
// The faults, injected in every run where they apply: the source's outcome
// unknown for some records (half written with the acknowledgement lost,
// half never written); an instance stopped abruptly mid-batch and replaced;
// a second instance joining mid-batch; an instance stalled in its handler
// past its session timeout while a replacement with its name starts, then
// woken. Each fault strikes while a handler is held mid-batch: the lab
// wraps each pattern's handler with a gate, arms the gate to catch the next
// handler call, then writes the next part of the workload, so that some
// handler is certain to arrive, however fast or slow the machine. Every
// wait of a run (for progress, for a handler to reach a fault, for an
// instance to stop) is bounded by [Lab.StepTimeout]; a step that does not
// finish fails the run with a *[StepError] naming the pattern, the step and
// the progress seen. The lab stops instances by cancelling them with no
// drain, which for eos.Processor is a clean abort; the SIGKILL versions of
// these faults are in the eos and offsetstore tests.
package eoslab
