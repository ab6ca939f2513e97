package dedup

import (
	"errors"
	"fmt"
)

var (
	// ErrMissingID is wrapped by the *[eoskit.RecordError] a [Consumer] stops with
	// when a record has no id under [RejectMissingID].
	ErrMissingID = errors.New("dedup: record has no message id")

	// ErrIDTooLong is wrapped by the *[eoskit.RecordError] a [Consumer] stops with
	// when a record's id is longer than [MaxIDLength] bytes: a key index
	// entry that large is refused by PostgreSQL, so the record could never
	// be claimed.
	ErrIDTooLong = fmt.Errorf("dedup: message id longer than %d bytes", MaxIDLength)
)

// MaxIDLength is the longest message id, in bytes, a [PostgresStore] claims.
// PostgreSQL's B-tree index refuses entries over about 2.7 KB; ids are
// checked against this bound before the database sees them.
const MaxIDLength = 1024
