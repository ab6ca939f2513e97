package eoskit

import (
	"errors"
	"fmt"
	"strconv"
)

var (
	// ErrInvalidConfig is wrapped by every *[ConfigError]: a constructor
	// was given options that are missing, malformed, or contradict the
	// chosen delivery semantics.
	ErrInvalidConfig = errors.New("eoskit: invalid configuration")

	// ErrRunning is returned by a runner's Run (an eos Processor's, an
	// offsetstore Runner's, a dedup Consumer's or an outbox Relay's) while
	// another Run of the same runner is under way.
	ErrRunning = errors.New("eoskit: Run called while already running")

	// ErrRunnerOwnsTx is what Commit and Rollback return on the
	// transaction an offsetstore or dedup handler is given: the runner
	// commits it, with the batch's offsets or claims, or rolls it back. A
	// handler that ignores the error changes nothing; one that returns it
	// fails its record like any error.
	ErrRunnerOwnsTx = errors.New("eoskit: the transaction is the runner's: it commits or rolls back the batch with its offsets or claims; a handler must not Commit or Rollback it")
)

// ConfigError is returned by the constructors of eos, offsetstore, dedup
// and outbox for a configuration they refuse (and by some Runs, for a
// database schema older than the code, or a dead-letter or position topic
// that does not exist): one type for every runner. It names the setting at
// fault and why. errors.Is(err, [ErrInvalidConfig]) matches it.
type ConfigError struct {
	// Package is the package that refused it: "eos", "offsetstore",
	// "dedup" or "outbox".
	Package string
	// Setting is the option at fault, for example "RequiredAcks".
	Setting string
	// Semantics is the delivery semantics the setting was checked against
	// ("at-most-once", "at-least-once" or "exactly-once", as
	// eos.Semantics.String gives it), or "" if none.
	Semantics string
	Reason    string
	// Err is the cause, if another error is one (a franz-go option's,
	// say).
	Err error
}

func (e *ConfigError) Error() string {
	pkg := e.Package
	if pkg == "" {
		pkg = "eoskit"
	}
	msg := fmt.Sprintf("%s: invalid configuration: %s: %s", pkg, e.Setting, e.Reason)
	if e.Semantics != "" {
		msg += fmt.Sprintf(" (semantics %s)", e.Semantics)
	}
	return msg
}

// Unwrap lets errors.Is(err, ErrInvalidConfig) match, and errors.Is and
// errors.As reach the cause.
func (e *ConfigError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalidConfig}
	}
	return []error{ErrInvalidConfig, e.Err}
}

// RecordError names an input record that stopped a runner: under the Stop
// error policy, once a Retry's attempts ran out, or when the record cannot
// be processed at all (dedup: a record without a usable id). Its offset
// was not committed (or, for offsetstore, not stored), so it is read again
// when the runner next starts. errors.Is and errors.As see Err, the
// handler's error (or its output's, or the runner's reason, such as
// dedup.ErrMissingID). An eos Processor, an offsetstore Runner and a dedup
// Consumer all return this type. (An outbox Relay stops on a row Kafka
// refused with its own outbox.RecordError, which names the row.)
type RecordError struct {
	Topic     string
	Partition int32
	Offset    int64
	// Attempts is how many times its handler failed before the runner
	// gave up, counted across the rules of a Classify (1 under Stop alone;
	// 0 when the handler never ran).
	Attempts int
	Err      error
}

func (e *RecordError) Error() string {
	var after string
	if e.Attempts > 1 {
		after = " after " + strconv.Itoa(e.Attempts) + " attempts"
	}
	return fmt.Sprintf("eoskit: record %s[%d]@%d failed%s: %v", e.Topic, e.Partition, e.Offset, after, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// AuthorizationError is what a runner's Run returns when the broker
// refuses a request for want of an ACL, naming the permission to grant;
// errors.Is matches the broker's refusal (kerr.TopicAuthorizationFailed,
// kerr.GroupAuthorizationFailed, kerr.TransactionalIDAuthorizationFailed,
// kerr.ClusterAuthorizationFailed). eoskit's runners end Run with it
// instead of retrying what can never succeed (franz-go retries a refused
// group join or topic read forever).
//
// A refused read or group join must last a few seconds first (an ACL
// granted a moment after the start is fine); nothing was applied for a
// record that could not be read. An eos Processor's refused output or
// dead-letter write ends the run at once with its transaction aborted; a
// refused EndTxn or offset commit ends it too, and the broker aborts the
// transaction at its timeout (read_committed readers of its partitions
// wait until then). Either way nothing is committed, so nothing is lost:
// grant the ACL and run again. The README lists the ACLs each path needs.
type AuthorizationError struct {
	// Permission is what to grant, as "Read on topic orders", "Read on
	// group billing", "Write on topic invoices" or "Write on
	// transactional id billing-0".
	Permission string
	// Err is the broker's refusal (kerr.TopicAuthorizationFailed and the
	// like): errors.Is matches it.
	Err error
}

func (e *AuthorizationError) Error() string {
	return "not authorized: grant this principal " + e.Permission + " (" + e.Err.Error() + ")"
}

func (e *AuthorizationError) Unwrap() error { return e.Err }
