// Package patterns holds eoskit's runnable reference patterns, one per
// delivery guarantee (at-most-once, at-least-once, exactly-once Kafka to
// Kafka, exactly-once Kafka to PostgreSQL, effectively-once with
// deduplication, exactly-once producer resume), all on one shared workload so
// that what each guarantees, and what each loses or duplicates under faults,
// can be compared side by side.
//
// Nothing imports patterns: it composes eos, offsetstore and dedup.
//
// Status: the patterns are specified by issue "patterns" and not yet written.
package patterns
