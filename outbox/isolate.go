package outbox

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
)

const (
	// probeRecords bounds the records of one probe (one aborted Kafka
	// transaction); a quarter of the transaction timeout bounds its time.
	probeRecords = 5000
	// probeChunk is how many records a probe produces together; a
	// chunk Kafka refuses is probed again one record at a time.
	probeChunk = 500
)

// isolation is how far the search for refused records went in one
// database transaction.
type isolation struct {
	end       pglogrepl.LSN // the transaction's end: which one
	next      int           // its rows before next passed (or are dead)
	slowUntil int           // rows before it, from next, are probed one at a time
	done      bool          // every row probed
}

// probe finds which of t's records Kafka refuses as their own fault
// (adding them to r.dead, or returning the *RecordError if no
// DeadLetter topic is set), without publishing any: in Kafka transactions
// it aborts, each of at most probeRecords records and a quarter of the
// transaction timeout, so that none outlives the timeout however large t
// is. Its progress is kept in r.iso: a session that ends midway (Kafka
// unreachable, say) leaves the next to go on from there.
func (r *Relay) probe(ctx context.Context, s *stream, p publisher, t *dbTxn) error {
	if r.iso.end != t.end {
		r.iso = isolation{end: t.end}
	}
	if r.iso.done {
		return nil
	}
	budget := r.cfg.txnTimeout / 4
	for r.iso.next < len(t.rows) {
		from := r.iso.next
		to := min(len(t.rows), from+probeRecords)
		chunk := probeChunk
		if from < r.iso.slowUntil {
			chunk, to = 1, min(to, r.iso.slowUntil)
		}
		recs := make([]*kgo.Record, 0, to-from)
		for _, rw := range t.rows[from:to] {
			recs = append(recs, r.cfg.record(rw, r.dead))
		}
		done := s.waiting(0)
		passed, err := p.probe(ctx, recs, chunk, budget)
		done()
		r.iso.next += passed
		if err == nil {
			continue
		}
		if errors.Is(err, errNoProbe) {
			return err
		}
		pe, ok := errors.AsType[*eos.ProduceError](err)
		if !ok || !(recordsFault(pe.Err) || strings.Contains(pe.Err.Error(), "invalid record partitioning choice")) {
			return err // not a record's fault: the session ends, r.iso stays
		}
		if chunk > 1 {
			// Whose fault it was in the chunk: one at a time.
			r.iso.slowUntil = r.iso.next + chunk
			continue
		}
		if retry, err := r.blame(ctx, err, &pending{dead: r.dead, isolate: true, oneByOne: true}); !retry {
			return err
		}
		r.iso.next++ // dead-lettered from now on
	}
	r.iso.done = true
	return nil
}
