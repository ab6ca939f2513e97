package offsetstore

import (
	"github.com/eoskit/eoskit/internal/authz"

	"errors"
	"fmt"
	"time"
)

// AuthorizationError is what Run returns when the broker keeps refusing to
// let the runner read its topic or join its group for want of an ACL,
// naming the permission to grant (Permission: "Read on topic T", "Read on
// group G"); errors.Is matches the broker's refusal
// (kerr.TopicAuthorizationFailed, kerr.GroupAuthorizationFailed). The
// refusal must last a few seconds first (an ACL granted a moment after the
// start is fine). Nothing was applied for a record it could not read. The
// README lists the ACLs each path needs.
type AuthorizationError = authz.Error

var (
	// ErrInvalidConfig is wrapped by every error [New] returns for a
	// missing, malformed or contradictory option.
	ErrInvalidConfig = errors.New("offsetstore: invalid configuration")
)

// RecordError is a record that stopped a [Runner] under [Stop]. Its offset
// was not stored, so it is read again on the next start.
type RecordError struct {
	Topic     string
	Partition int32
	Offset    int64
	Err       error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("offsetstore: handler failed on %s[%d]@%d: %v", e.Topic, e.Partition, e.Offset, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// ErrorPolicy is what a [Runner] does with a record whose handler fails.
// The batch it was in is rolled back first, and run again one record per
// transaction to find the record that fails; the policy then applies to it.
type ErrorPolicy struct {
	kind    policyKind
	backoff time.Duration
}

type policyKind int8

const (
	policyStop policyKind = iota
	policyRetry
	policyDeadLetter
)

// Stop makes Run return a *RecordError naming the record. The default.
func Stop() ErrorPolicy { return ErrorPolicy{kind: policyStop} }

// Retry retries the record after backoff for as long as it fails.
func Retry(backoff time.Duration) ErrorPolicy {
	return ErrorPolicy{kind: policyRetry, backoff: backoff}
}

// DeadLetter parks the record (key, value, coordinates, error) in the
// eoskit_dead_letters table, in the same transaction that stores its offset,
// and goes on.
func DeadLetter() ErrorPolicy { return ErrorPolicy{kind: policyDeadLetter} }
