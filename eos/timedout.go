package eos

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// A transaction that outlives its timeout is aborted by its coordinator,
// which bumps the epoch to do it, and the producer's next request fails
// with an epoch error that reads like fencing. A newer instance that
// registered the same transactional id fails it the same way. Restarting
// after the first is right; after the second it would fence the healthy
// successor in turn. The coordinator's state tells them apart.

// timedOutAlone reports whether coord, the coordinator's state for a
// transactional id, says that the transaction producer id pid ran at epoch
// was aborted for outliving its timeout and that nobody registered the id
// since. The coordinator aborts a timed-out transaction by bumping the
// epoch once and writing abort markers (PrepareAbort, then CompleteAbort,
// at epoch+1, same producer id). A newer producer's InitProducerID bumps it
// again (epoch+2 or beyond), and under transaction protocol v2 every
// transaction it ends bumps it once more: any other state means the id has
// another owner, or cannot be told, and counts as fenced.
//
// Two windows remain, both narrow. A successor's InitProducerID that
// fences an open transaction leaves the same state (epoch+1, aborting)
// until its retry registers the id, about 100 ms later, or for good if the
// successor dies in between; and a successor may register between this
// read and the restarted session's own registration. A zombie that reads
// in either window restarts and fences the successor once; the successor's
// next session fences it back, and the zombie, now past no timeout, stops
// with ErrFenced. No record is lost or doubled either way: fencing only
// ever aborts.
func timedOutAlone(coord kadm.DescribedTransaction, pid int64, epoch int16) bool {
	return coord.ProducerID == pid && int(coord.ProducerEpoch) == int(epoch)+1 &&
		(coord.State == "PrepareAbort" || coord.State == "CompleteAbort")
}

// coordinatorTimedOut asks txnID's coordinator whether the transaction of
// pid at epoch was aborted for its timeout with nobody else involved (see
// timedOutAlone). It needs Describe on the transactional id, which every
// producer of it has. A coordinator that cannot be read (moving after a
// broker restart, say) is asked again for up to endTimeout; after that it
// answers false, and the caller stops as fenced, which loses nothing.
func coordinatorTimedOut(ctx context.Context, adm *kadm.Client, txnID string, pid int64, epoch int16) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	for {
		described, err := adm.DescribeTransactions(ctx, txnID)
		if err == nil {
			d, ok := described[txnID]
			switch {
			case ok && d.Err == nil:
				return timedOutAlone(d, pid, epoch)
			case ok && !kerr.IsRetriable(d.Err):
				return false // refused, or an id the coordinator does not know
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond):
		}
	}
}
