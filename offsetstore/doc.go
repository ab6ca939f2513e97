// Package offsetstore gives exactly-once processing for pipelines whose
// results live in PostgreSQL: each batch's results and the consumer's next
// offsets are written in one PostgreSQL transaction, and on every partition
// assignment the consumer seeks to the offsets stored there, never to the
// offsets Kafka holds for the group.
//
// Guarantee (once implemented): every input record's effect is in the
// database exactly once, across crashes, restarts and rebalances, provided
// every write of the handler goes through the transaction it is given, and the
// offset write fences stale owners (a compare-and-set on the offset a batch
// started from).
//
// Status: the package is specified by issue "offsetstore" and not yet
// implemented; nothing here may be relied upon.
package offsetstore
