package hanging

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/eoskit/eoskit/internal/txnscan"
)

// evidence is what one output partition's log says of how a transaction
// ended.
type evidence struct {
	partition string // topic[partition]
	// joined: a later, live transaction of the same producer (at
	// joinedEpoch) holds the partition from before the transaction's first
	// record there; its end decides those records.
	joined      bool
	joinedEpoch int16
	unreadable  error // the marker could not be read
	gone        bool  // the transaction's first record there is gone (deleted or lost)
	found       bool  // the producer's first marker after the first record
	commit      bool  // that marker commits
}

// decide says how this processor's transaction at epoch ended, from the
// best evidence there is: it reads each output partition's log (judge
// weighs what it read). wait is true while the outcome cannot be known
// yet; evidence names what decided.
func (s *hangSweeper) decide(ctx context.Context, coord kadm.DescribedTransaction, id int64, epoch int16, open map[txnscan.Key]kadm.DescribedProducer) (commit, known, wait bool, why string) {
	rec, _ := s.outcomes.lookup(id, epoch)
	var read []evidence
	for tp, first := range rec.Firsts {
		e := evidence{partition: fmt.Sprintf("%s[%d]", tp.Topic, tp.Partition)}
		if q, isOpen := open[txnscan.Key{ProducerID: id, Topic: tp.Topic, Partition: tp.Partition}]; isOpen && q.CurrentTxnStartOffset <= first {
			if q.ProducerEpoch == epoch {
				continue // still open for this transaction: closed with the rest
			}
			e.joined, e.joinedEpoch = true, q.ProducerEpoch
		} else {
			c, found, err := txnscan.MarkerAfter(ctx, s.adm, s.readerOpts, tp.Topic, tp.Partition, first, id, epoch)
			switch {
			case errors.Is(err, txnscan.ErrRecordsGone):
				e.gone = true
				s.logger.Debug("eos: a transaction's records are gone from an output partition", "partition", e.partition, "err", err)
			case err != nil:
				e.unreadable = err
				s.logger.Debug("eos: reading a transaction's marker failed", "partition", e.partition, "err", err)
			default:
				e.found, e.commit = found, c
			}
		}
		read = append(read, e)
		if e.joined || e.unreadable != nil {
			break // judge waits on it whatever the others say
		}
	}
	return judge(read, rec, coord, id, epoch)
}

// judge weighs the evidence of how a transaction at epoch ended: first
// the log of the output partitions it wrote to (the first marker of the
// producer after the transaction's first record there is the one that
// closed its records, whatever the coordinator or EndTxn said: the chaos
// suite saw a broker lose a committed transaction's markers and the next
// transaction's abort marker close its records too, and the offsets must
// then be aborted to match); then the EndTxn answer (rec, when Known);
// then the coordinator's state, when it is on producer id (one that
// moved on to another id says nothing of this one's epochs); an EndTxn
// answer the coordinator's state contradicts is no answer (unknown). It waits while a partition is
// joined by a later, live transaction (whose end will decide the records
// there) or could not be read. A partition whose records are gone
// (deleted by retention or a purge, compacted, lost to a truncation) says
// nothing, and never will; then the EndTxn answer is not trusted either:
// a later transaction's abort may have closed those records, its marker
// gone with them. The records gone, how they ended no longer matters to
// a reader; the other partitions' markers still decide.
func judge(read []evidence, rec Record, coord kadm.DescribedTransaction, id int64, epoch int16) (commit, known, wait bool, why string) {
	gone := "" // a partition whose records are gone, if any
	var seen []bool
	for _, e := range read {
		switch {
		case e.joined:
			return false, false, true, fmt.Sprintf("joined in %s by this producer's transaction at epoch %d", e.partition, e.joinedEpoch)
		case e.unreadable != nil:
			return false, false, true, "its marker in " + e.partition + " could not be read: " + e.unreadable.Error()
		case e.gone:
			gone = e.partition
		case e.found:
			seen = append(seen, e.commit)
		}
	}
	if len(seen) > 0 {
		for _, c := range seen[1:] {
			if c != seen[0] {
				return false, false, false, "torn: its output partitions hold both markers" // reported as unknown
			}
		}
		return seen[0], true, false, "the marker that closed its records in an output partition"
	}
	if coord.ProducerID == id {
		commit, known = txnscan.CoordinatorOutcome(coord, epoch)
	}
	if rec.Known && gone == "" {
		if known && commit != rec.Committed {
			return false, false, false, fmt.Sprintf("none: this processor's EndTxn answer (committed %v) and the coordinator's state (%s at epoch %d) disagree", rec.Committed, coord.State, coord.ProducerEpoch)
		}
		return rec.Committed, true, false, "this processor's EndTxn answer"
	}
	if !known {
		if coord.ProducerID != id {
			return false, false, false, fmt.Sprintf("none: the coordinator moved on to producer id %d", coord.ProducerID)
		}
		if gone != "" {
			return false, false, false, fmt.Sprintf("none: its records in %s are gone, and the coordinator is %s at epoch %d", gone, coord.State, coord.ProducerEpoch)
		}
		return false, false, false, fmt.Sprintf("none: the coordinator is %s at epoch %d", coord.State, coord.ProducerEpoch)
	}
	return commit, known, false, fmt.Sprintf("the coordinator's state (%s at epoch %d)", coord.State, coord.ProducerEpoch)
}
