package eos

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/changelog"
	"github.com/eoskit/eoskit/internal/loop"
)

// Restores outside the loop. A partition the group assigns is paused at
// once (the group's callback: its records are not fetched), and the loop's
// next prepare opens its store and restores it in the background, up to
// maxParallelRestores at once, while the partitions already restored go
// on being handled in transactions; once restored it is resumed, and its
// records come. A partition taken away while it restores has its restore
// cancelled (or unqueued), and its store parked once the restore
// returned. A restore that fails is the session's failure, returned by
// the loop's next prepare between transactions. Whatever resumed a
// partition early (the lanes of Concurrency resume what they paused, but
// not a partition restoring: resumeUnlessRestoring), its records polled wait for its
// restore between transactions, or have it restored there if it is
// still queued; inside a transaction they restart the session (they
// must not wait out a restore there).

// restoreTask is a background restore under way: cancel stops it, done
// is closed once it returned and its marks were settled.
type restoreTask struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// pause stops fetching ps of the input on cl (the session's client, from
// the group's callback), until their restore resumes them.
func (ks *keyedState) pause(cl *kgo.Client, ps []int32) {
	if cl != nil && len(ps) > 0 {
		cl.PauseFetchPartitions(map[string][]int32{ks.input: ps})
	}
}

// resumeIfDoneLocked fetches p again, restored, unless it was assigned
// again or taken away meanwhile (ks.mu and marksMu held: the decision and
// the resume are one step against the group's callbacks, which pause
// under marksMu).
func (ks *keyedState) resumeIfDoneLocked(p int32) {
	if restoring, taken := ks.marksOf(p); ks.cl != nil && !restoring && !taken {
		ks.cl.ResumeFetchPartitions(map[string][]int32{ks.input: {p}})
	}
}

// resumeUnlessRestoring resumes ps on cl (the lanes' resume of what they
// paused), but the input partitions a restore holds (marked, queued or
// under way): those come once restored. The decision and the resume are
// one step under marksMu.
func (ks *keyedState) resumeUnlessRestoring(cl pauser, ps map[string][]int32) {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	ks.marksMu.Lock()
	defer ks.marksMu.Unlock()
	out := map[string][]int32{}
	for t, parts := range ps {
		for _, p := range parts {
			if restoring, _ := ks.marksOf(p); t != ks.input || !restoring {
				out[t] = append(out[t], p)
			}
		}
	}
	if len(out) > 0 {
		cl.ResumeFetchPartitions(out)
	}
}

// startRestores queues the jobs' restores and starts what the bound
// allows; the jobs' stores are in parts, marked restoring.
func (ks *keyedState) startRestores(jobs []restoreJob) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.marksMu.Lock()
	defer ks.marksMu.Unlock()
	ks.queued = append(ks.queued, jobs...)
	ks.launchLocked()
}

// launchLocked starts queued restores while fewer than
// maxParallelRestores run (ks.mu and marksMu held); a queued partition
// taken away meanwhile is left for closeTakenLocked to park.
func (ks *keyedState) launchLocked() {
	for len(ks.queued) > 0 && len(ks.tasks) < maxParallelRestores && ks.bgCtx != nil {
		j := ks.queued[0]
		ks.queued = ks.queued[1:]
		if ks.taken[j.p] || ks.tasks[j.p] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(ks.bgCtx)
		t := &restoreTask{cancel: cancel, done: make(chan struct{})}
		ks.tasks[j.p] = t
		ks.pause(ks.cl, []int32{j.p}) // whatever resumed it meanwhile
		ks.bgWG.Add(1)
		go ks.runRestore(ctx, j, t)
	}
}

// runRestore restores j's store; settles p's marks once it returned: a
// restore not cancelled meanwhile (by a revoke, a new assignment, the
// session's end) leaves p ready and fetched again, or fails the session.
func (ks *keyedState) runRestore(ctx context.Context, j restoreJob, t *restoreTask) {
	defer ks.bgWG.Done()
	res, err := ks.restorer.Restore(ctx, ks.cfg.changelog, j.p, j.ps.store, changelog.Options{Timeout: ks.cfg.restoreTimeout, Logger: ks.logger})
	if err == nil {
		ks.report(ctx, j.p, res)
	}
	ks.mu.Lock()
	ks.marksMu.Lock()
	// Looked at under the locks: a revoke or an assignment (which cancel
	// it) lands before or after, never between the look and the marks.
	current := ctx.Err() == nil
	delete(ks.tasks, j.p)
	t.cancel()
	switch {
	case current && err == nil:
		delete(ks.restoring, j.p)
		ks.resumeIfDoneLocked(j.p)
	case current && ks.bgErr == nil:
		ks.bgErr = err
	}
	ks.launchLocked()
	ks.marksMu.Unlock()
	ks.mu.Unlock()
	close(t.done)
	if ks.wake != nil {
		ks.wake() // an idle loop prepares again: a new restore, or this one's failure
	}
}

// report tells the metrics of p's restore, unless ctx (the restore's:
// a background one's is cancelled by a revoke, a new assignment or the
// session's end; restoreAll's by a sibling's failure or Run's end) was
// cancelled. Both paths call it before they mark p readable, and mark it
// only if ctx is still live then, so that whoever sees p ready sees its
// restore reported too; a cancel landing between the two leaves p
// unready, reported once more than it was made ready.
func (ks *keyedState) report(ctx context.Context, p int32, res changelog.Result) {
	if ctx.Err() == nil && ks.restored != nil {
		ks.restored(p, res)
	}
}

// cancelRestoreLocked cancels p's background restore, if one runs
// (marksMu held).
func (ks *keyedState) cancelRestoreLocked(p int32) {
	if t := ks.tasks[p]; t != nil {
		t.cancel()
	}
}

// unqueueLocked drops p's queued restore (marksMu held): its store is
// parked or closed.
func (ks *keyedState) unqueueLocked(p int32) {
	kept := ks.queued[:0]
	for _, j := range ks.queued {
		if j.p != p {
			kept = append(kept, j)
		}
	}
	ks.queued = kept
}

// holdPolled makes the polled partitions' records wait for their
// background restores: between transactions, it waits for those under
// way and takes the queued ones out of the queue, marked for prepare to
// restore at once; inside a transaction (between false), a polled
// partition restoring restarts the session (the transaction must not
// wait out a restore; its records are read again). A partition marked
// restoring with no restore under way (queued, or whose restore failed or
// was cancelled) is held as a queued one. It runs on every poll: with
// nothing restoring it looks no further, and it takes the views' lock
// for reading only.
func (ks *keyedState) holdPolled(ctx context.Context, polled []int32, between bool) error {
	for _, p := range polled {
		ks.mu.RLock()
		ks.marksMu.Lock()
		if len(ks.tasks) == 0 && len(ks.restoring) == 0 {
			ks.marksMu.Unlock()
			ks.mu.RUnlock()
			return nil
		}
		t, held := ks.tasks[p], ks.restoring[p] && ks.tasks[p] == nil
		if held && between {
			ks.unqueueLocked(p)
			ks.restore[p] = true
		}
		ks.marksMu.Unlock()
		ks.mu.RUnlock()
		switch {
		case !between && (t != nil || held):
			return loop.Restart(fmt.Errorf("eos: records of partition %d came while its store restores", p))
		case t != nil:
			select {
			case <-t.done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// restoreFailed returns, once, the failure of a background restore.
func (ks *keyedState) restoreFailed() error {
	ks.marksMu.Lock()
	defer ks.marksMu.Unlock()
	err := ks.bgErr
	ks.bgErr = nil
	return err
}

// runningLocked reports whether p's background restore runs (marksMu
// held).
func (ks *keyedState) runningLocked(p int32) bool { return ks.tasks[p] != nil }

// stopRestores cancels the background restores and waits for them to
// return (no lock held: they take ks.mu to settle), forgetting the
// queued ones: the session ends.
func (ks *keyedState) stopRestores() {
	ks.marksMu.Lock()
	if ks.bgCancel != nil {
		ks.bgCancel()
	}
	ks.bgCtx, ks.bgCancel = nil, nil
	ks.queued = nil
	ks.marksMu.Unlock()
	ks.bgWG.Wait() // every restore goroutine returned, its reports made
}
