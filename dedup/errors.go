package dedup

import (
	"errors"
	"fmt"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/loop"
)

// AuthorizationError is what Run returns when the broker keeps refusing to
// let the consumer read its topic or join its group for want of an ACL,
// naming the permission to grant (Permission: "Read on topic T", "Read on
// group G"); errors.Is matches the broker's refusal
// (kerr.TopicAuthorizationFailed, kerr.GroupAuthorizationFailed). The
// refusal must last a few seconds first (an ACL granted a moment after the
// start is fine). Nothing was applied for a record it could not read. The
// README lists the ACLs each path needs.
type AuthorizationError = authz.Error

// ConfigError is what the constructors return for a missing, malformed or
// contradictory option, and Run for a database not migrated for what the
// options ask: eos's type, shared by every runner, with Package "dedup".
type ConfigError = eos.ConfigError

var (
	// ErrInvalidConfig is wrapped by every *ConfigError. It is
	// eos.ErrInvalidConfig.
	ErrInvalidConfig = eos.ErrInvalidConfig

	// ErrMissingID is wrapped by the *RecordError a [Consumer] stops with
	// when a record has no id under [RejectMissingID].
	ErrMissingID = errors.New("dedup: record has no message id")

	// ErrIDTooLong is wrapped by the *RecordError a [Consumer] stops with
	// when a record's id is longer than [MaxIDLength] bytes: a key index
	// entry that large is refused by PostgreSQL, so the record could never
	// be claimed.
	ErrIDTooLong = fmt.Errorf("dedup: message id longer than %d bytes", MaxIDLength)
)

// MaxIDLength is the longest message id, in bytes, a [PostgresStore] claims.
// PostgreSQL's B-tree index refuses entries over about 2.7 KB; ids are
// checked against this bound before the database sees them.
const MaxIDLength = 1024

// RecordError names a record that stopped a [Consumer]: under [Stop], once
// a [Retry]'s attempts ran out, or for want of a usable id. Its offset was
// not committed, so it is read again on the next start. Err is the
// handler's error, [ErrMissingID] or [ErrIDTooLong]. eos and offsetstore
// return the same type.
type RecordError = loop.RecordError

// ErrRunning is returned by Run while another Run of the same consumer is
// under way (the same error as eos's, offsetstore's and outbox's).
var ErrRunning = loop.ErrRunning
