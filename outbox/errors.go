package outbox

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Errors callers react to; test with errors.Is. A fenced relay returns an
// error wrapping eos.ErrFenced.
var (
	// ErrWALLevel: the server's wal_level is not logical, so nothing can
	// be decoded from its log. Set wal_level = logical in postgresql.conf
	// (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL.
	ErrWALLevel = errors.New("outbox: PostgreSQL's wal_level must be logical")

	// ErrSchema: the outbox table is missing or at another version: run
	// [Migrate].
	ErrSchema = errors.New("outbox: the outbox schema is missing or at another version (run outbox.Migrate)")

	// ErrNoSlot: the replication slot does not exist in this database.
	ErrNoSlot = errors.New("outbox: no such replication slot")

	// ErrPosition: the relay's position in Kafka could not be read or is
	// malformed.
	ErrPosition = errors.New("outbox: the relay's position could not be read")

	// ErrRewound: the database was restored to before what the relay last
	// published (a backup, a volume snapshot, a failover to a replica
	// behind): the log no longer holds the transaction Kafka's position
	// ends with. The relay refuses until an operator decides (see the
	// package documentation).
	ErrRewound = errors.New("outbox: the database was restored to before what the relay last published")

	// ErrTableChanged: the outbox table's columns are not the ones this
	// code writes (someone altered it).
	ErrTableChanged = errors.New("outbox: the outbox table's columns changed")

	// ErrInvalidPartition is wrapped by the *RecordError (and the dead
	// letter's error) of a record written with WriteToPartition to a
	// partition its topic does not have, as a fresh metadata look-up
	// confirms: the record's fault.
	ErrInvalidPartition = errors.New("outbox: the topic has no such partition")

	// ErrPositionRecord is wrapped by the *RecordError (and the dead
	// letter's error) of an outbox record addressed to the relay's
	// position topic, or keyed as a position record of this database
	// ("<system id>/<slot>"): published, it could move a relay's
	// position (its own, or another service's) on that relay's next
	// start, skipping or repeating records. The relay never publishes it.
	ErrPositionRecord = errors.New("outbox: the record is addressed as a relay's position")
)

// RecordError is an outbox record Kafka refused, stopping the relay. Its
// row stays in the write-ahead log the slot holds: nothing is lost, and the
// relay publishes it, in order, once Kafka accepts it (or routes it with
// [DeadLetter] to a dead-letter topic). errors.Is matches Err, for example
// kerr.MessageTooLarge or kerr.UnknownTopicOrPartition.
type RecordError struct {
	ID        int64  // the outbox row's id
	Topic     string // where it was to go
	Partition int32  // -1 unless written with [WriteToPartition]
	Err       error
}

func (e *RecordError) Error() string {
	where := e.Topic
	if e.Partition >= 0 {
		where = fmt.Sprintf("%s[%d]", e.Topic, e.Partition)
	}
	return fmt.Sprintf("outbox: record %d for %s was refused: %v", e.ID, where, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// recordsFault reports whether Kafka refused a record for what the record
// itself is, so that dead-lettering it (and only it) is right. An invalid
// timestamp is not: the relay stamps every record with its commit time,
// and a topic's message.timestamp.*.max.ms refuses a whole backlog alike.
// A partition its topic lacks is (ErrInvalidPartition, which blame wraps
// only once a fresh metadata look-up confirms it); one the producer's
// metadata does not know yet (partitions just added) is not.
func recordsFault(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage) ||
		errors.Is(err, ErrInvalidPartition) || errors.Is(err, ErrPositionRecord)
}
