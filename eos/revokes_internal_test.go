package eos

import "testing"

// A revoke that comes while End runs may come after End tried the commit
// (franz-go passes it on as End returns): it must not make an End that
// reports no commit a known abort, nor the next one, which franz-go tries
// to commit (End resets its latch). A revoke between two Ends does make
// the next one a known abort (issue 43 item 1).
func TestARevokeWhileEndRunsLeavesTheOutcomeToTheBroker(t *testing.T) {
	var r revokes
	before, _, _ := r.end(func() (bool, error) { return true, nil })
	if before {
		t.Fatal("no revoke at all, yet the End was taken for one that came before it")
	}
	r.taken() // between two Ends
	before, _, _ = r.end(func() (bool, error) { return false, nil })
	if !before {
		t.Fatal("a revoke before End began was not reported: an abort franz-go made untried would be sent to the broker's offsets")
	}
	if r.pending.Load() {
		t.Fatal("End did not clear the batch's early stop")
	}
	before, _, _ = r.end(func() (bool, error) {
		r.taken() // while End runs, after the commit may have been tried
		return false, nil
	})
	if before {
		t.Fatal("a revoke that came while End ran was taken for one before it: an unconfirmed commit would pass for a rebalance's abort")
	}
	if !r.pending.Load() {
		t.Fatal("a revoke that came while End ran no longer stops the next batch early (franz-go may have latched it for that one)")
	}
	before, _, _ = r.end(func() (bool, error) { return false, nil })
	if before {
		t.Fatal("the revoke seen while the previous End ran counted again for the next")
	}
}
