// Package state keeps keyed state for exactly-once processing: per input
// partition, a store of committed state whose changelog (a compacted topic
// co-partitioned with the input) is written in the same Kafka transaction
// as the outputs and the input offsets.
//
// # The pieces
//
// A [Store] holds one partition's committed state and its [Checkpoint]:
// the next changelog offset to read, and the changelog topic's ID.
// [NewMemory] is the default store. Package
// [github.com/eoskit/eoskit/state/pebblestore] keeps one on disk (one
// pebble database per partition, laid out as root/<topic>/<partition>),
// so that a restart restores only the changelog past its checkpoint; only
// a program that imports it links pebble.
//
// A [Txn] lays one transaction's writes over a store. A handler sees it as
// a [KV] (Get, Put, Delete) and reads its own writes; the runner ends the
// transaction: it produces [Txn.Dirty] (one record per changed key, its
// final value, nil for a delete) to the changelog partition of the input's
// number, and once the transaction committed calls [Txn.Commit] with the
// offset past the last of them; after an abort it calls [Txn.Abort].
//
//	store := state.NewMemory()
//	tx := state.NewTxn(store, maxRecordBytes)
//	n, err := state.Count(tx, key)               // in the handler
//	recs := state.Updates(tx.Dirty(), "counts") // one per changed key
//	// ... produce recs and the changelog in the transaction, commit it ...
//	err = tx.Commit(nextChangelogOffset)
//
// [Count], [Sum] and [Reduce] aggregate by key. Counts and sums are stored
// as decimal text ("42"), which a dashboard or a console consumer reads as
// it is; [Int64] and [AppendInt64] decode and encode them. [Updates] gives
// an aggregation's output: one record per key changed in the transaction,
// as Kafka Streams' record cache does.
//
// A store is a [Reader]: Get and Range are safe from any goroutine (an
// HTTP handler) while a runner applies transactions, and see committed
// state only, each transaction whole.
//
// # What is guaranteed
//
//   - Nothing a transaction wrote is visible outside it (to a Reader, to
//     the next transaction, to another instance) unless the transaction
//     committed in Kafka: a store is applied only after the commit. After
//     an abort the store is exactly as the last committed transaction
//     left it.
//   - A store is never ahead of its changelog's committed records; it may
//     be behind (a crash between the commit and the Apply, a pebble batch
//     lost with the machine), and a restore reads the changelog from its
//     checkpoint with read_committed up to the high watermark, once the
//     transactions open there ended, before the partition's first record
//     is handled (the last stable offset may still lie before the
//     previous owner's last committed transaction, whose marker can reach
//     the changelog after its offsets commit). Local state past what
//     committed is never trusted: Apply writes the checkpoint in the same
//     atomic batch as the writes it describes (KIP-892's design).
//   - A store whose checkpoint does not belong to the changelog as it is
//     (another topic ID: the topic was deleted and created again; an
//     offset past the high watermark or before the log start offset) is
//     wiped and restored whole.
//   - A key and value too large for the changelog's max.message.bytes
//     fail the Put with [ErrTooLarge]: the fault of the record being
//     handled, which its error policy then decides.
//   - A restore that makes no progress for its timeout is a
//     *[RestoreError] naming the changelog partition and how far it got;
//     what it applied stays applied.
//
// # What breaks it
//
//   - Another writer on the changelog, or a changelog with another
//     partition count than the input, or whose cleanup.policy is not
//     compact alone, compact,delete included (retention deletes keys; a
//     restore silently misses them). A runner
//     refuses the last two when it may read the topic's configs
//     (DescribeConfigs); an application account without it gets a
//     warning, and the cleanup policy is then the operator's to keep.
//   - Adding partitions to the input or the changelog: keys move to
//     partitions whose state does not hold them.
//   - A pebble store whose checkpoint is older than the changelog's
//     delete.retention.ms (24 h by default): a tombstone written since may
//     have been compacted away, and the key it deleted survives locally.
//     Delete such a store's directory to restore it whole.
//   - Writing a store by hand (Apply, Reset) while a runner owns its
//     partition, or two processes sharing a pebble directory (pebble's
//     lock refuses the second open).
//   - A handler that keeps state outside its KV: it is not rolled back on
//     an abort.
//
// # Memory
//
// The memory store costs about 108 bytes of heap per key for 10-byte keys
// and 8-byte values (measured on Go 1.26 with 1,000,000 keys: a Go map of
// strings, its slots, and the two small allocations), so roughly 90 bytes
// plus the key's and value's lengths. Past a few million keys per
// instance, use the pebble store (package pebblestore).
package state
