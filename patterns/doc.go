// Package patterns is the index of eoskit's reference patterns: short
// programs to copy and deploy, one per way of getting a real-time
// case-count dashboard exact (reports per region, summed into totals that
// must neither miss a report nor count one twice). Each is a package with
// a Config, a New(cfg) returning its runner, a Run(ctx, cfg) and the
// pattern's handler, where it has one (the source, producerresume, has a
// Producer instead, and outboxrelay a Submit), and a main program under
// its cmd/ directory that reads flags, handles SIGTERM and runs it; the
// runners' programs also answer Kubernetes' probes and Prometheus on
// -http (package probe, package eosprom). docs/operating.md says how to
// deploy them.
//
// # Which pattern
//
//   - [github.com/eoskit/eoskit/patterns/kafkatokafka]: Kafka in, Kafka
//     out, exactly once. eos.Processor commits a batch's outputs and its
//     input offsets in one Kafka transaction, and with Config.Totals the
//     per-region totals too, kept in its keyed state (eos.Sum with a
//     changelog) and published to a totals topic. Choose it when the
//     result is another topic (the dashboard's feed, or its totals).
//   - [github.com/eoskit/eoskit/patterns/kafkatopostgres]: Kafka in,
//     PostgreSQL out, exactly once. offsetstore commits a batch's rows and
//     its offsets in one database transaction. Choose it when the result
//     is in the database and the topic holds each report once.
//   - [github.com/eoskit/eoskit/patterns/dedupconsumer]: Kafka in,
//     PostgreSQL out, effectively once. dedup claims each report's message
//     id in the transaction that applies it. Choose it when the producers
//     resend (so the topic may hold a report twice) and stamp each report
//     with an id once.
//   - [github.com/eoskit/eoskit/patterns/outboxrelay]: PostgreSQL in, Kafka
//     out, exactly once: the transactional outbox. The service writes each
//     report into the outbox in its own transaction, and outbox.Relay
//     publishes it. Choose it when the report starts life in the database.
//   - [github.com/eoskit/eoskit/patterns/producerresume]: a source into
//     Kafka, exactly once, without transactions. The only writer of a
//     partition reads its last record after an unknown outcome, and after
//     a crash, to decide whether to resend. Choose it for the source that
//     feeds kafkatokafka or kafkatopostgres.
//
// [github.com/eoskit/eoskit/patterns/application] is not a pattern of its
// own but a whole service built from two: a count with keyed state served
// over HTTP from any instance, and its totals copied into PostgreSQL; a
// single main package, the program docs/build-your-application.md walks
// through.
//
// [github.com/eoskit/eoskit/patterns/dashboard/web] is the dashboard as a
// live web page: kafkatokafka's totals and counts per day, served from
// any instance, which adds up every partition from its owner and shows
// no numbers while one is missing.
//
// [github.com/eoskit/eoskit/patterns/dashboard] is the domain they share:
// the report, its encoding, the two tables and the one update that keeps a
// total.
//
// # The layout, and why
//
// One package per pattern, so that a pattern is copied by copying one
// directory (pattern.go and cmd/), and its imports are eoskit's library
// packages and dashboard, never another pattern. The pattern holds what a
// deployment fixes (which runner, which semantics, the handler, the
// transactional id, where a new group starts); Config holds what differs
// between deployments (addresses, names) and Options what is tuning. The
// main programs differ only in their flags: each is meant to be read, and
// copied, alone.
//
// # What shows that they hold
//
// cmd/eoslab runs each pattern, and weaker designs beside them (at-most-once,
// at-least-once, totals in a Go map outside the transaction, an
// at-least-once outbox relay), on one workload through the
// same injected faults (unknown outcomes at the source, a crash mid-batch,
// a rebalance mid-batch, an instance stalled past its session timeout) and
// prints what the verifier found. The faults live in the lab
// (cmd/eoslab/internal/eoslab), which wraps the patterns' handlers and options; no
// pattern knows of them. The SIGKILL versions of the faults are in the
// eos, offsetstore, dedup and outbox tests.
package patterns
