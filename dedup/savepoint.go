package dedup

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/loop"
)

// batchState is what a batch's runs learn about its records, kept from one
// run (one database transaction) to the next.
type batchState struct {
	failures map[*kgo.Record]int
	poisoned map[*kgo.Record]error
	// careful: a handler failed in this batch; it runs with savepoints.
	careful bool
}

// A batch that met a handler's failure runs again with savepoints (see
// apply): one taken every chunk records the handler ran on, so that a
// record that fails rolls back to the savepoint before it, its chunk's
// records before it run again, and the batch goes on. One name, taken
// again after each chunk (RELEASE, then SAVEPOINT, in one round trip);
// ROLLBACK TO keeps it, fresh, for what runs next.
const (
	savepointSQL         = `SAVEPOINT eoskit_chunk`
	nextSavepointSQL     = `RELEASE SAVEPOINT eoskit_chunk; SAVEPOINT eoskit_chunk`
	rollbackSavepointSQL = `ROLLBACK TO SAVEPOINT eoskit_chunk`
)

// rollbackTimeout bounds the rollback to the savepoint after a handler's
// failure: a connection that does not answer within it is the database's
// failure, not the record's.
const rollbackTimeout = 2 * time.Second

// Savepoints per batch: a chunk holds at least minChunk records and is made
// long enough that a batch takes at most maxChunks savepoints that write,
// plus one per record parked. PostgreSQL keeps the ids of at most 64
// subtransactions per backend in shared memory; past that every snapshot
// taken while the transaction is open must look subtransactions up in
// pg_subtrans, which slows the whole server down.
const (
	minChunk  = 16
	maxChunks = 48
)

// chunkSize is how many handler calls a savepoint covers in a batch of n.
func chunkSize(n int) int { return max(minChunk, (n+maxChunks-1)/maxChunks) }

// parksNow reports whether a record whose handler failed with err, for
// the attempts-th time in its batch, is parked now, in the batch's
// transaction: DeadLetter, or a Retry's DeadLetter fallback once its
// attempts ran out. Otherwise the batch rolls back and afterFailure
// decides: a pause before running it again, or a stop.
func (c *Consumer) parksNow(err error, attempts int) bool {
	return loop.Decide(c.cfg.policy, err, attempts).Fate == loop.FateDeadLetter
}
