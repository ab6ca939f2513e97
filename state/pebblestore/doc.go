// Package pebblestore is the disk-backed [state.Store] on
// github.com/cockroachdb/pebble: one database per changelog partition,
// holding the partition's keys and the checkpoint of the last Apply, so
// that a processor restarted on the same disk restores only the
// changelog's tail.
//
// It is a package of its own, as pgx keeps its pool in pgxpool, so that
// only a program that keeps state on disk links pebble: eos, state,
// offsetstore, dedup and outbox do not.
//
//	p, err := eos.NewProcessor(handler, /* ... */
//		eos.Changelog("counts-changelog", eos.Stores(pebblestore.Factory("/var/lib/counts", nil))))
//
// Its log is synced once a second while transactions come ([SyncEvery]),
// from a goroutine of each store: a process killed, or a machine that
// crashes, leaves the checkpoint of a transaction at most a second or so
// old, and a restart restores the changelog from there.
//
// What it guarantees and what breaks it is the state package's doc: a
// store is never ahead of what committed in Kafka; a checkpoint older
// than the changelog's log start (or of another topic ID) makes the
// restore wipe the store and read the whole changelog; a directory is
// locked by the process that opened it.
package pebblestore
