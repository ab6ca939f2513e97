package offsetstore

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kgo"
)

// RejectError is the error a [Handler] returns, made by [Reject], to name
// the record of its batch that it cannot apply. The runner then need not
// search the batch for it: inside the batch's database transaction it rolls
// back to a savepoint taken before the handler's call, runs the handler
// again on the records before the one named, applies the error policy to
// that record alone ([DeadLetter] parks it in the same transaction, [eoskit.Stop]
// ends Run with a *[eoskit.RecordError] naming it), and goes on with the records
// after it; the batch then commits once, with its offsets.
//
// The policy sees the handler's error as returned: errors.Is and errors.As
// reach Err through it, and a dead letter keeps its text. An error that is
// the database's doing (a lost connection, a deadlock: see the package
// documentation) is never blamed on the record named with it: the batch
// is retried whole.
type RejectError struct {
	// Record is the record rejected: one of the records the handler was
	// given in this call, matched by topic, partition and offset.
	Record *kgo.Record
	// Err is why (ErrRejected when Reject was given nil).
	Err error
}

// Reject returns a *[RejectError] naming rec, one of the records the
// handler was given in this call, as the record the batch fails on, for
// err. A handler that validates its records before writing them names the
// first bad one:
//
//	for _, rec := range recs {
//		if err := check(rec); err != nil {
//			return offsetstore.Reject(rec, err)
//		}
//	}
//
// A record that is not among those the handler was given in this call is
// the handler's bug: Run stops with an error wrapping
// [ErrRejectedOutsideBatch], and nothing of the batch is committed.
func Reject(rec *kgo.Record, err error) error {
	if err == nil {
		err = ErrRejected
	}
	return &RejectError{Record: rec, Err: err}
}

// Error returns Err's text: the runner logs and parks the record's
// coordinates with it.
func (e *RejectError) Error() string { return e.Unwrap().Error() }

// Unwrap returns Err ([ErrRejected] when it is nil).
func (e *RejectError) Unwrap() error {
	if e == nil || e.Err == nil {
		return ErrRejected
	}
	return e.Err
}

var (
	// ErrRejected is the cause [Reject] gives a record rejected with a nil
	// error.
	ErrRejected = errors.New("offsetstore: record rejected by the handler")

	// ErrRejectedOutsideBatch is wrapped by the error Run returns when a
	// handler names, with [Reject], a record that is not among those it
	// was given in that call (nil, or another batch's): a bug of the
	// handler, which the runner does not guess around. The batch is
	// rolled back; a Run after the fix reads it again.
	ErrRejectedOutsideBatch = errors.New("offsetstore: the handler rejected a record that is not in the records it was given")
)
