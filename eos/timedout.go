package eos

import (
	"context"

	"github.com/twmb/franz-go/pkg/kadm"
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
func timedOutAlone(coord kadm.DescribedTransaction, pid int64, epoch int16) bool {
	return coord.ProducerID == pid && int(coord.ProducerEpoch) == int(epoch)+1 &&
		(coord.State == "PrepareAbort" || coord.State == "CompleteAbort")
}

// coordinatorTimedOut asks txnID's coordinator whether the transaction of
// pid at epoch was aborted for its timeout with nobody else involved (see
// timedOutAlone). It needs Describe on the transactional id, which every
// producer of it has. It answers false when the coordinator cannot be
// read: the caller then stops as fenced, which is safe.
func coordinatorTimedOut(ctx context.Context, adm *kadm.Client, txnID string, pid int64, epoch int16) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
	defer cancel()
	described, err := adm.DescribeTransactions(ctx, txnID)
	if err != nil {
		return false
	}
	d, ok := described[txnID]
	return ok && d.Err == nil && timedOutAlone(d, pid, epoch)
}
