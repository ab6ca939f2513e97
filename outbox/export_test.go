package outbox

import "time"

// BeforeCommit runs fn inside each Kafka transaction (or, at-least-once,
// each batch), after its records and position were produced and its rows
// deleted, just before it commits: where tests stall or crash a relay.
func BeforeCommit(fn func()) Option {
	return relayOption(func(c *config) { c.hooks.beforeCommit = fn })
}

// AfterCommit runs fn once a batch committed in Kafka, before the slot is
// told; fn returning true ends the session there, as a crash would, and
// Run starts the next from the position in Kafka.
func AfterCommit(fn func() bool) Option {
	return relayOption(func(c *config) { c.hooks.afterCommit = fn })
}

// HideFromDeletion makes the relay's deletions pass over the rows hide
// reports, as if their transactions were not visible yet (decoded before
// a synchronous standby acknowledged the commit): the relay takes them
// for rows it must delete later.
func HideFromDeletion(hide func(id int64) bool) Option {
	return relayOption(func(c *config) { c.hooks.hideFromDeletion = hide })
}

// MarkerWait sets how long the position read waits for the markers of a
// transaction still open under the slot's key (a minute by default).
func MarkerWait(d time.Duration) Option {
	return relayOption(func(c *config) { c.markerWait = d })
}

// ReadTxnHook runs fn after each database transaction read from the slot
// after a batch's first, with its rows: a slow read of a large one.
func ReadTxnHook(fn func(rows int)) Option {
	return relayOption(func(c *config) { c.hooks.readTxn = fn })
}
