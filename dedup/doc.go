// Package dedup makes an at-least-once Kafka pipeline apply each message's
// side effect once: the consumer claims the message's unique id with an
// INSERT ... ON CONFLICT DO NOTHING in the same database transaction as the
// side effect, and skips ids it has already claimed.
//
// Guarantee (once implemented): effectively-once side effects for every
// message whose id is stable across retries and replays, as long as a
// redelivery arrives within the retention horizon of the processed-ids table.
//
// Status: the package is specified by issue "dedup" and not yet implemented;
// nothing here may be relied upon.
package dedup
