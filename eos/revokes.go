package eos

import "sync/atomic"

// revokes is what a session knows of the group's revocations and losses
// that took partitions (groupHooks records them, taken).
//
// franz-go's GroupTransactSession aborts, untried, a transaction whose
// End begins after a revoke or a loss; a revoke that comes while End runs
// waits for End's lock and is passed on only as End returns, after the
// commit may have been tried. So the outcome of an End that reports no
// commit is a known abort only for a revoke that came before End began
// (end); for one that came while it ran, only the broker's offsets tell
// (knownAbort).
type revokes struct {
	// pending asks the batch under way to end early (collect): the group
	// took partitions, so it cannot commit. Each end clears it.
	pending atomic.Bool
	// count counts the revocations and losses.
	count atomic.Int64
	// endedAt is count when the session's last End returned; only the
	// session's goroutine reads and writes it.
	endedAt int64
}

// taken records a revocation or a loss that took partitions.
func (r *revokes) taken() {
	r.pending.Store(true)
	r.count.Add(1)
}

// end runs end, a GroupTransactSession's End, and reports whether the
// group took partitions between the previous End's return and this one's
// start: then franz-go did not try to commit. A revoke recorded while end
// runs counts for neither: for this End only the broker's offsets tell,
// and the next one franz-go tries to commit, since End resets its latch.
// One recorded after end returned (its callback ran after that reset, so
// franz-go latched it) counts for the next.
func (r *revokes) end(end func() (committed bool, err error)) (before, committed bool, err error) {
	start := r.count.Load()
	before = start > r.endedAt
	committed, err = end()
	r.endedAt = r.count.Load()
	if r.endedAt == start {
		// The batch's early stop is cleared only when no revoke came
		// while End ran: one that did may be latched for the next
		// transaction, which must then end early too.
		r.pending.Store(false)
	}
	return before, committed, err
}
