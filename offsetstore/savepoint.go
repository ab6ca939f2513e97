package offsetstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/deadletter"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/pgretry"
)

// The savepoint every handler call of a batch runs under, so that a call
// that fails rolls back its own writes only. One name, taken again after
// each call that succeeded (RELEASE, then SAVEPOINT, in one round trip);
// ROLLBACK TO keeps it, fresh, for the next call. The first is taken in
// the round trip of the offsets rows' claim.
const (
	savepointSQL         = `SAVEPOINT eoskit_batch`
	releaseSavepointSQL  = `RELEASE SAVEPOINT eoskit_batch`
	rollbackSavepointSQL = `ROLLBACK TO SAVEPOINT eoskit_batch`
)

// rollbackTimeout bounds the rollback to the savepoint after a handler's
// failure. The rollback is also what tells a failure of the records from
// the database's (as pgretry.TransientOn's ping would, a round trip
// earlier): a connection closed, or not answering within the bound, fails
// it, and the batch is retried whole.
const rollbackTimeout = 2 * time.Second

// recordKey is a record of a batch by its coordinates.
type recordKey struct {
	topic     string
	partition int32
	offset    int64
}

func keyOf(r *kgo.Record) recordKey { return recordKey{r.Topic, r.Partition, r.Offset} }

// batchState is what a batch's attempts learn about its records, kept
// from one attempt (one database transaction) to the next.
type batchState struct {
	// failures counts, per record, its handler's failures in this batch.
	failures map[recordKey]int
	// settled holds the records parked by an attempt that then rolled
	// back: the next attempts park them again without calling the
	// handler.
	settled map[recordKey]error
	// oneByOne: a failure left the connection busy with none named
	// (failBusy); the handler is called one record at a time.
	oneByOne bool
	// unconfirmed is the last attempt when its COMMIT went unanswered
	// (the connection broke): the next attempt asks the database whether
	// it committed (Runner.confirmed) before claiming the rows its own
	// commit may have moved.
	unconfirmed *attemptEnd
}

func newBatchState() *batchState {
	return &batchState{failures: map[recordKey]int{}, settled: map[recordKey]error{}}
}

// batchRun is one attempt at a batch, inside its database transaction,
// after the claim of its offsets rows: it calls the handler on the batch,
// and on a failure it rolls back to the savepoint taken before the call
// and settles the record at fault without leaving the transaction.
type batchRun struct {
	r  *Runner
	tx pgx.Tx
	st *batchState
	// ids are the topics' IDs this batch claimed its offsets rows under:
	// its dead letters are keyed by them too.
	ids map[string]pgtype.UUID
	// dirty: the savepoint holds the work of a call that succeeded (or a
	// park), which the next call must not roll back: it takes a new one.
	dirty bool
	// pending holds the parks not sent yet: they go with the next
	// savepoint's statements, or before the offsets advance (flush), in
	// one round trip.
	pending *pgx.Batch
	// parked are the records parked in this attempt.
	parked []parkedRecord
	// failed counts the records settled in this attempt.
	failed int
	// halt, when set, ended the attempt: a Retry to run after a pause
	// (the transaction rolls back), or a record to stop on (the records
	// before it commit).
	halt *halt
}

type parkedRecord struct {
	rec      *kgo.Record
	cause    error
	attempts int
}

// halt is why an attempt stopped short of the batch's end.
type halt struct {
	rec      *kgo.Record
	cause    error
	attempts int
	// retry: the record's policy is a Retry with attempts left: the
	// transaction rolls back, and the batch runs again after backoff.
	retry   bool
	backoff time.Duration
}

// errHalted ends an attempt whose halt is set.
var errHalted = errors.New("offsetstore: attempt halted")

// run applies recs, in order: the records an earlier attempt parked are
// parked again, the others go to the handler, a run of them per call.
func (b *batchRun) run(ctx context.Context, recs []*kgo.Record) error {
	start := 0
	for i, rec := range recs {
		cause, ok := b.st.settled[keyOf(rec)]
		if !ok {
			continue
		}
		if err := b.segment(ctx, recs[start:i]); err != nil {
			return err
		}
		if err := b.park(ctx, rec, cause, b.st.failures[keyOf(rec)]); err != nil {
			return err
		}
		start = i + 1
	}
	return b.segment(ctx, recs[start:])
}

// segment calls the handler on seg under a savepoint. When it fails for
// a record's fault, the call is rolled back to the savepoint, and the
// record at fault is found: the one the handler named with Reject (the
// records before it run again, the policy settles it, the records after
// it run next), or, when it named none, by splitting seg in halves, each
// run under a savepoint of its own, down to the record that fails alone.
// An error that is the database's doing ends the attempt: no record is
// blamed for it.
func (b *batchRun) segment(ctx context.Context, seg []*kgo.Record) error {
	if b.st.oneByOne {
		for i := range seg {
			if err := b.split(ctx, seg[i:i+1], false); err != nil {
				return err
			}
		}
		return nil
	}
	return b.split(ctx, seg, false)
}

// split is segment, for a seg known to fail (fails) when its first half
// had no failure although the whole did: its second half is then split at
// once instead of called whole, a call saved at each level of the search.
// A seg that does not fail after all (a failure that took both halves)
// just runs in smaller calls.
func (b *batchRun) split(ctx context.Context, seg []*kgo.Record, fails bool) error {
	if len(seg) == 0 {
		return nil
	}
	if !fails || len(seg) == 1 {
		err := b.call(ctx, seg)
		if err == nil {
			return nil
		}
		if errors.Is(err, errFailed) {
			return nil // settled
		}
		if !errors.Is(err, errSplit) {
			return err
		}
	}
	mid := len(seg) / 2
	before := b.failed
	if err := b.split(ctx, seg[:mid], false); err != nil {
		return err
	}
	return b.split(ctx, seg[mid:], b.failed == before)
}

// errSplit and errFailed are what call returns when the handler failed on
// seg naming nothing (seg is to be split), and when the record at fault
// was settled.
var (
	errSplit  = errors.New("offsetstore: split the records")
	errFailed = errors.New("offsetstore: record settled")
)

// call runs the handler on seg under a fresh savepoint, and rolls back to
// it if it fails: nil when it succeeded, errSplit when it failed naming
// nothing in a seg of several records, errFailed once a single record or
// one it named was settled; else what ends the attempt.
func (b *batchRun) call(ctx context.Context, seg []*kgo.Record) error {
	if b.dirty {
		b.queue().Queue(releaseSavepointSQL)
		b.pending.Queue(savepointSQL)
		b.dirty = false
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	err := b.r.callHandler(ctx, b.tx, seg)
	if err == nil {
		b.dirty = true
		return nil
	}
	if errors.Is(err, eoskit.ErrRunnerOwnsTx) {
		return err // the handler's bug: Run ends, nothing of the batch committed
	}
	// Told from the database's own signals (its SQLSTATE, an error pgconn
	// made) and this transaction's own connection, before it goes back
	// to the pool: with a pool of Concurrency's size, another connection
	// may be long in coming. Never from the error's shape: an io.EOF from
	// a decoder, a *net.OpError from an enrichment call are the record's.
	if pgretry.FromHandler(err) || b.tx.Conn().IsClosed() {
		return &handlerError{err: err, transient: true}
	}
	if b.tx.Conn().PgConn().IsBusy() {
		return b.failBusy(seg, err)
	}
	rctx, cancel := context.WithTimeout(ctx, rollbackTimeout)
	_, rerr := b.tx.Exec(rctx, rollbackSavepointSQL)
	cancel()
	if rerr != nil {
		// The connection failed or went silent under the handler: the
		// database's doing, not the records'.
		return &handlerError{err: fmt.Errorf("%w (then the rollback to its savepoint failed: %w)", err, rerr), transient: true}
	}
	if rej, ok := errors.AsType[*RejectError](err); ok {
		i, outside := rejectedIn(seg, rej, err)
		if outside != nil {
			return outside
		}
		if err := b.segment(ctx, seg[:i]); err != nil {
			return err
		}
		if err := b.fail(ctx, seg[i], err); err != nil {
			return err
		}
		if err := b.segment(ctx, seg[i+1:]); err != nil {
			return err
		}
		return errFailed
	}
	if len(seg) > 1 {
		return errSplit
	}
	if err := b.fail(ctx, seg[0], err); err != nil {
		return err
	}
	return errFailed
}

// failBusy settles a failure of the handler that left rows open on the
// transaction's connection: no statement can follow on it, the rollback
// to the savepoint included, and the attempt is lost; the failure is the
// records' all the same. The record at fault (the one named, or seg's
// only one) has its failure counted and its policy applied across
// attempts: parked by the next attempt without its handler, retried, or
// stopped on (nothing of the batch commits then). With several records
// and none named, the next attempt calls the handler one record at a
// time, to find it.
func (b *batchRun) failBusy(seg []*kgo.Record, err error) error {
	var rec *kgo.Record
	if rej, ok := errors.AsType[*RejectError](err); ok && rej != nil {
		i, outside := rejectedIn(seg, rej, err)
		if outside != nil {
			return outside // the handler's bug, as without open rows
		}
		rec = seg[i]
	}
	if rec == nil && len(seg) == 1 {
		rec = seg[0]
	}
	if rec == nil {
		b.st.oneByOne = true
		return &busyError{err: err}
	}
	k := keyOf(rec)
	b.st.failures[k]++
	h := b.r.applyPolicy(rec, err, b.st.failures[k])
	switch {
	case h == nil:
		b.st.settled[k] = err
		return &busyError{err: err}
	case h.retry:
		return &retryError{halt: h}
	default:
		return &stopError{err: &eoskit.RecordError{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Attempts: h.attempts, Err: err}}
	}
}

// rejectedIn returns the index in seg of the record rej names, or, when it
// names none of them (nil, another batch's), the error wrapping
// ErrRejectedOutsideBatch that stops Run: the handler's bug, no record's.
func rejectedIn(seg []*kgo.Record, rej *RejectError, err error) (int, error) {
	if rej.Record != nil {
		k := keyOf(rej.Record)
		for j, rec := range seg {
			if keyOf(rec) == k {
				return j, nil
			}
		}
	}
	named := "nil"
	if rej.Record != nil {
		named = fmt.Sprintf("%s[%d]@%d", rej.Record.Topic, rej.Record.Partition, rej.Record.Offset)
	}
	return -1, fmt.Errorf("%w: it named %s, and was given %d records from %s[%d]@%d: %w", ErrRejectedOutsideBatch,
		named, len(seg), seg[0].Topic, seg[0].Partition, seg[0].Offset, err)
}

// busyError ends an attempt whose transaction a handler's open rows
// made unusable (failBusy): the batch runs again at once.
type busyError struct{ err error }

func (e *busyError) Error() string {
	return "offsetstore: the handler failed leaving rows open on its transaction's connection: " + e.err.Error()
}
func (e *busyError) Unwrap() error { return e.err }

// fail applies the error policy to rec, whose handler failed with cause
// (its writes rolled back): it parks rec, or halts the attempt.
func (b *batchRun) fail(ctx context.Context, rec *kgo.Record, cause error) error {
	k := keyOf(rec)
	b.failed++
	b.st.failures[k]++
	attempts := b.st.failures[k]
	h := b.r.applyPolicy(rec, cause, attempts)
	if h != nil {
		b.halt = h
		return errHalted
	}
	b.st.settled[k] = cause
	return b.park(ctx, rec, cause, attempts)
}

// park writes rec in the dead-letter table, in the transaction that
// stores its offset.
func (b *batchRun) park(_ context.Context, rec *kgo.Record, cause error, attempts int) error {
	if err := deadletter.QueuePark(b.queue(), "offsetstore", b.r.cfg.core.Group, rec, b.ids[rec.Topic].Bytes, cause, nil); err != nil {
		return err
	}
	b.dirty = true
	b.parked = append(b.parked, parkedRecord{rec: rec, cause: cause, attempts: attempts})
	return nil
}

func (b *batchRun) queue() *pgx.Batch {
	if b.pending == nil {
		b.pending = &pgx.Batch{}
	}
	return b.pending
}

// flush sends what is pending, in one round trip.
func (b *batchRun) flush(ctx context.Context) error {
	if b.pending == nil {
		return nil
	}
	batch := b.pending
	b.pending = nil
	return b.tx.SendBatch(ctx, batch).Close()
}

// retryError rolls back an attempt that a Retry with attempts left
// halted: the batch runs again after the pause.
type retryError struct{ halt *halt }

func (e *retryError) Error() string {
	return fmt.Sprintf("offsetstore: record %s[%d]@%d failed (attempt %d): %v", e.halt.rec.Topic, e.halt.rec.Partition, e.halt.rec.Offset, e.halt.attempts, e.halt.cause)
}

// stopError rolls back an attempt halted on a record to stop on, with no
// record before it to commit.
type stopError struct{ err *eoskit.RecordError }

func (e *stopError) Error() string { return e.err.Error() }

// retryPause logs a Retry's failure and pauses; false when ctx ended.
func (r *Runner) retryPause(ctx context.Context, h *halt) bool {
	r.cfg.core.Logger.Warn("offsetstore: handler failed; rolled the batch back, retrying it", "topic", h.rec.Topic, "partition", h.rec.Partition,
		"offset", h.rec.Offset, "err", loop.ErrorText(h.cause), "attempt", h.attempts, "backoff", h.backoff)
	return loop.Sleep(ctx, h.backoff)
}
