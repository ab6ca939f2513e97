package eos

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/hanging"
)

// Errors callers react to. Every error eos returns that means one of these
// wraps it, so test with errors.Is. The errors every runner shares
// ([eoskit.ErrInvalidConfig], [eoskit.ErrRunning]) and their types
// (*[eoskit.ConfigError], *[eoskit.RecordError],
// *[eoskit.AuthorizationError]) are package eoskit's.
var (
	// ErrFenced means a newer producer with the same transactional id has
	// taken over (Kafka bumped the producer epoch). It is final: the
	// producer or processor that returned it is closed and must not be used
	// again. A zombie instance gets it when it wakes up after its
	// replacement started.
	ErrFenced = errors.New("eos: fenced by a newer producer with the same transactional id")

	// ErrAborted means the transaction was aborted: none of its records is
	// visible to read_committed readers, and none of its consumed offsets
	// was committed. The error also wraps the cause.
	ErrAborted = errors.New("eos: transaction aborted")

	// ErrOutcomeUnknown means a commit was sent but its outcome could not
	// be confirmed (for example the connection broke while EndTxn was in
	// flight). The transaction may or may not be visible. eos has already
	// retried the end as an abort, which bumps the producer epoch so that
	// nothing more can be added to it; the producer remains usable.
	ErrOutcomeUnknown = errors.New("eos: transaction outcome unknown")

	// ErrTransactionTimedOut means the transaction outlived its
	// transaction timeout (kgo.TransactionTimeout) and the broker aborted
	// it, with no other producer involved: it is wrapped with ErrAborted,
	// and the producer stays usable, so the caller may retry (with less
	// work per transaction, or a longer timeout). The broker's epoch bump
	// looks like fencing; eos tells the two apart from the transaction
	// coordinator's state.
	ErrTransactionTimedOut = errors.New("eos: the transaction outlived its timeout and the broker aborted it")

	// ErrHandlerTooSlow is wrapped by the *[eoskit.RecordError] of an input record
	// whose handler, alone in its transaction, gave up with its ctx's error
	// when the transaction's budget (three quarters of the transaction
	// timeout) ran out, twice: no transaction can hold it, so it follows
	// the error policy.
	ErrHandlerTooSlow = errors.New("eos: handler slower than a transaction may last")

	// ErrHangingTransaction is wrapped by every *HangingTransactionError.
	ErrHangingTransaction = errors.New("eos: a transaction of this processor hangs")

	// ErrClosed is returned by calls on a producer or processor that was
	// closed.
	ErrClosed = errors.New("eos: closed")
)

// ProduceError is a record the broker did not acknowledge. Err wraps the
// franz-go or Kafka error (errors.Is(err, kerr.MessageTooLarge) works).
type ProduceError struct {
	Topic     string
	Partition int32
	Err       error
	// Record is the record that failed, for callers that must name what
	// it stood for (its Context carries what they attached).
	Record *kgo.Record
}

func (e *ProduceError) Error() string {
	return fmt.Sprintf("eos: produce to %s[%d]: %v", e.Topic, e.Partition, e.Err)
}

func (e *ProduceError) Unwrap() error { return e.Err }

// DeadLetterError is returned by a [Processor] under the [DeadLetter]
// policy when an input's dead letter could not be written after a few
// attempts with a growing backoff (the dead-letter topic is missing, not
// writable, or the dead letter, with its headers, is too large). The
// input's offset was not committed: nothing is lost, and the record is read
// again when the processor next starts. errors.Is matches Err.
type DeadLetterError struct {
	// Topic, Partition and Offset name the input.
	Topic     string
	Partition int32
	Offset    int64
	// DeadLetterTopic is where it was to go, after Attempts tries.
	DeadLetterTopic string
	Attempts        int
	// Cause is why the input was dead-lettered (its handler's error, or
	// its output's); Err why the dead letter could not be written.
	Cause, Err error
}

func (e *DeadLetterError) Error() string {
	return fmt.Sprintf("eos: the dead letter of %s[%d]@%d could not be written to %s (%d attempts): %v; the record had failed with: %v",
		e.Topic, e.Partition, e.Offset, e.DeadLetterTopic, e.Attempts, e.Err, e.Cause)
}

func (e *DeadLetterError) Unwrap() error { return e.Err }

// isFenced reports whether err means this producer's epoch is gone for good.
// Under transaction protocol v2 (KIP-890, the default on Kafka 4.x) an
// InvalidProducerEpoch is as final as ProducerFenced.
func isFenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// pollError wraps what a poll returned: a refusal as it is, anything
// else as the client closing under the processor.
func pollError(err error) error {
	if _, ok := errors.AsType[*eoskit.AuthorizationError](err); ok {
		return err
	}
	return fmt.Errorf("eos: %w: %w", ErrClosed, err)
}

// fencedError wraps err so that errors.Is matches both ErrFenced and the
// Kafka error that caused it.
func fencedError(op string, err error) error {
	return fmt.Errorf("eos: %s: %w: %w", op, ErrFenced, err)
}

// abortable reports whether EndTxn answered that the commit was not
// attempted, so that retrying as an abort is safe and its outcome known.
func abortable(err error) bool {
	return errors.Is(err, kerr.OperationNotAttempted) || errors.Is(err, kerr.TransactionAbortable)
}

func produceError(r *kgo.Record, err error) error {
	return &ProduceError{Topic: r.Topic, Partition: r.Partition, Err: err, Record: r}
}

// HangingTransactionError is what Run returns, under [StopWhenHanging],
// when a partition holds one of the processor's own transactions open
// while its coordinator has moved on (KIP-664): no marker will ever close
// it, and the processor's next transaction would join it there. An
// operator closes it with the outcome its records already have, with
// eoskit's command (it needs ClusterAction):
//
//	go run github.com/eoskit/eoskit/cmd/eoskit txn close -topic T -partition P -producer-id N -dry-run
//
// which writes the marker of the outcome the coordinator's state gives,
// and refuses when that is unknown until it is told (find out first: read
// the output partitions' markers). kafka-transactions.sh abort writes only
// abort markers: right for "aborted", wrong for "committed". Then run the
// processor again.
type HangingTransactionError struct {
	Topic         string
	Partition     int32
	ProducerID    int64
	ProducerEpoch int16
	StartOffset   int64  // the transaction's first offset in the partition
	Outcome       string // "committed", "aborted" or "unknown": how its records elsewhere ended
	Evidence      string // what the outcome was read from
}

func (e *HangingTransactionError) Error() string {
	return fmt.Sprintf("eos: a transaction of this processor hangs in %s[%d] (producer id %d, epoch %d, open since offset %d; outcome %s, from %s)",
		e.Topic, e.Partition, e.ProducerID, e.ProducerEpoch, e.StartOffset, e.Outcome, e.Evidence)
}

// Unwrap lets errors.Is(err, ErrHangingTransaction) match.
func (e *HangingTransactionError) Unwrap() error { return ErrHangingTransaction }

// hangingError is err, the hanging check's, with a finding reported as a
// *HangingTransactionError.
func hangingError(err error) error {
	if f, ok := errors.AsType[*hanging.Finding](err); ok {
		return (*HangingTransactionError)(f)
	}
	return err
}

// checkedAgainst is a *eoskit.ConfigError's Semantics: s's name, or ""
// when s is zero (the setting was not checked against any).
func checkedAgainst(s Semantics) string {
	if s == 0 {
		return ""
	}
	return s.String()
}

// clientOptionsError is the *eoskit.ConfigError of a client that cannot be
// built from c's options.
func (c *config) clientOptionsError(err error) error {
	return &eoskit.ConfigError{Package: "eos", Setting: "ClientOptions", Semantics: checkedAgainst(c.semantics), Reason: err.Error(), Err: err}
}
