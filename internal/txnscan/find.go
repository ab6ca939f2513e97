package txnscan

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/eoskit/eoskit/internal/loop"
)

// A Hang is a transaction that a partition holds open while its coordinator
// has moved on.
type Hang struct {
	// The partition's view: topic, partition, producer id and epoch,
	// coordinator epoch and the offset the transaction starts at.
	kadm.DescribedProducer
	// TransactionalID holds the producer id; empty when none that the
	// caller may describe does any more (expired, or another principal's).
	TransactionalID string
	// Coordinator is the coordinator's state for TransactionalID.
	Coordinator kadm.DescribedTransaction
	// Outcome is how the transaction ended, where the coordinator's state
	// tells (transaction protocol v2 only): committed, aborted or
	// unknown. A marker written to close it must carry this outcome, or
	// exactly-once breaks.
	Outcome string
	// Evidence says what Outcome rests on.
	Evidence string
}

// FindOptions are what [Find] is told beyond where to look.
type FindOptions struct {
	// ClientsV2 says that the producers' clients speak transaction
	// protocol v2 (the cluster's TransactionVersion >= 2 is not enough: it
	// serves v1 to older clients): only then is an outcome read from the
	// coordinator's state (CoordinatorOutcome); otherwise every outcome is
	// unknown.
	ClientsV2 bool
	// MinAge guards the transactions no transactional id holds that the
	// caller may describe (ListTransactions shows only those), which may
	// be another principal's live ones. Such a transaction is reported
	// only if its producer last wrote MinAge ago or more by its record
	// times, and, since a producer chooses those (an outbox relay stamps
	// database commit times, hours old in a backlog), only if it is
	// unchanged (epoch, start offset, last sequence, last record time)
	// when Find looks again MinAge later: a live transaction writes, or
	// its coordinator aborts it once past its timeout, so a MinAge longer
	// than the cluster's transaction.max.timeout.ms plus its
	// transaction.abort.timed.out.transaction.cleanup.interval.ms (15
	// minutes and 10 s by default) tells them apart. Zero reports them at
	// once.
	MinAge time.Duration
	// Producer, when set, limits Find to that producer id's transactions
	// (what txn close asks about), so that another producer's wait is not
	// waited.
	Producer *int64
	// Waiting, if set, is told before Find waits MinAge to look again,
	// with how many transactions it waits to confirm.
	Waiting func(n int, d time.Duration)
}

// Find returns the hanging transactions in set's partitions, sorted by
// partition. A transaction that ends while Find looks is not reported:
// each hang is checked again, unchanged, after its coordinator was asked
// (and after opts.MinAge, for one that no describable id holds).
func Find(ctx context.Context, adm *kadm.Client, set kadm.TopicsSet, opts FindOptions) ([]Hang, error) {
	before, err := Open(ctx, adm, set)
	if err != nil || len(before) == 0 {
		return nil, err
	}
	var pids []int64
	for k := range before {
		if opts.Producer != nil && k.ProducerID != *opts.Producer {
			continue
		}
		if !slices.Contains(pids, k.ProducerID) {
			pids = append(pids, k.ProducerID)
		}
	}
	if len(pids) == 0 { // ListTransactions would list every one
		return nil, nil
	}
	listed, err := adm.ListTransactions(ctx, pids, nil)
	if err != nil {
		return nil, fmt.Errorf("list transactions of producer ids %v: %w", pids, err)
	}
	idOf := map[int64]string{}
	var ids []string
	for _, l := range listed.Sorted() {
		if _, ok := idOf[l.ProducerID]; !ok {
			idOf[l.ProducerID] = l.TxnID
			ids = append(ids, l.TxnID)
		}
	}
	described := kadm.DescribedTransactions{}
	if len(ids) > 0 {
		if described, err = adm.DescribeTransactions(ctx, ids...); err != nil {
			return nil, fmt.Errorf("describe transactions %v: %w", ids, err)
		}
	}
	var found []Hang
	unheld := 0
	for k, p := range before {
		if opts.Producer != nil && k.ProducerID != *opts.Producer {
			continue
		}
		h := Hang{DescribedProducer: p, TransactionalID: idOf[k.ProducerID], Outcome: "unknown"}
		if c, ok := described[h.TransactionalID]; ok && errors.Is(c.Err, kerr.TransactionalIDNotFound) {
			// Expired between the list and the describe: held by no id.
			h.TransactionalID = ""
		}
		if h.TransactionalID == "" {
			// Young by its producer's own clock: skipped. A time in the
			// future is no evidence of youth: the second look decides.
			if age := time.Since(time.UnixMilli(p.LastTimestamp)); age >= 0 && age < opts.MinAge {
				continue
			}
			h.Evidence = fmt.Sprintf("none: no transactional id (that this principal may describe) holds producer id %d any more", k.ProducerID)
			found = append(found, h)
			unheld++
			continue
		}
		coord, ok := described[h.TransactionalID]
		switch {
		case !ok:
			return nil, fmt.Errorf("describe transaction %s: the cluster did not describe it", h.TransactionalID)
		case coord.Err != nil:
			return nil, fmt.Errorf("describe transaction %s: %w", h.TransactionalID, coord.Err)
		}
		h.Coordinator = coord
		if Classify(coord, p) != Hanging {
			continue
		}
		switch commit, known := CoordinatorOutcome(coord, p.ProducerEpoch); {
		case coord.ProducerID != p.ProducerID:
			h.Evidence = fmt.Sprintf("none: transactional id %s moved on to producer id %d", h.TransactionalID, coord.ProducerID)
		case !opts.ClientsV2:
			h.Evidence = fmt.Sprintf("none known for a client of either protocol: the coordinator is %s at epoch %d (a protocol v2 client's outcome would read from that; a v1 client's epoch spans many transactions)", coord.State, coord.ProducerEpoch)
		case known:
			h.Outcome = OutcomeName(commit)
			h.Evidence = fmt.Sprintf("the coordinator's state (%s at epoch %d)", coord.State, coord.ProducerEpoch)
		default:
			h.Evidence = fmt.Sprintf("none: the coordinator is %s at epoch %d", coord.State, coord.ProducerEpoch)
		}
		found = append(found, h)
	}
	if len(found) == 0 {
		return nil, nil
	}
	if unheld > 0 && opts.MinAge > 0 {
		if opts.Waiting != nil {
			opts.Waiting(unheld, opts.MinAge)
		}
		if !loop.Sleep(ctx, opts.MinAge) {
			return nil, fmt.Errorf("waiting %v to confirm %d transactions no describable transactional id holds: %w", opts.MinAge, unheld, ctx.Err())
		}
	}
	after, err := Open(ctx, adm, set)
	for attempt := 1; err != nil && unheld > 0 && attempt < 3 && ctx.Err() == nil; attempt++ {
		// Not the whole wait lost to one passing error (a partition
		// between leaders).
		if loop.Sleep(ctx, time.Second) {
			after, err = Open(ctx, adm, set)
		}
	}
	if err != nil {
		return nil, err
	}
	found = slices.DeleteFunc(found, func(h Hang) bool {
		q, ok := after[Key{h.ProducerID, h.Topic, h.Partition}]
		return !ok || changed(h, q)
	})
	slices.SortFunc(found, func(a, b Hang) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.ProducerID, b.ProducerID))
	})
	return found, nil
}

// changed reports whether q, a later look at h's partition and producer,
// shows its transaction moved on: another one, or a write since (a
// hanging transaction gets none; a live producer of transaction protocol
// v1 can join the one open on the partition with its next transaction,
// same epoch, same start offset, after its coordinator was asked).
func changed(h Hang, q kadm.DescribedProducer) bool {
	return q.ProducerEpoch != h.ProducerEpoch || q.CurrentTxnStartOffset != h.CurrentTxnStartOffset ||
		q.LastSequence != h.LastSequence || q.LastTimestamp != h.LastTimestamp
}
