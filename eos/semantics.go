package eos

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

// Semantics is a delivery guarantee, as a named preset of producer and
// consumer settings.
type Semantics int8

const (
	// AtMostOnce may lose records: the producer does not retry, and a
	// consumer commits its offsets before it processes the records, so a
	// crash during processing skips them. Acks are the caller's choice
	// (default: the leader's). It does not promise "never twice" under
	// zombies: a member stalled past its session timeout can, after its
	// client rejoined, commit and handle records of a partition already
	// given to another member (a classic group's commit checks the
	// generation, not partition ownership).
	AtMostOnce Semantics = iota + 1

	// AtLeastOnce never loses a record but may write or process one twice:
	// the producer waits for all in-sync replicas and retries (without
	// idempotence, so a retry after a lost acknowledgement duplicates), and
	// a consumer commits its offsets only after its output was acknowledged,
	// so a crash in between processes the records again.
	AtLeastOnce

	// ExactlyOnce writes every record once and processes every input once:
	// idempotent, transactional writes with acks from all in-sync replicas,
	// read_committed reads, and consumed offsets committed inside the
	// transaction that carries the output.
	ExactlyOnce
)

func (s Semantics) String() string {
	switch s {
	case AtMostOnce:
		return "at-most-once"
	case AtLeastOnce:
		return "at-least-once"
	case ExactlyOnce:
		return "exactly-once"
	}
	return fmt.Sprintf("Semantics(%d)", int8(s))
}

func (s Semantics) valid() bool { return s >= AtMostOnce && s <= ExactlyOnce }

// ProducerOptions returns the franz-go producer options that define s.
// ExactlyOnce also needs a transactional id (kgo.TransactionalID), which is
// per instance and therefore not part of the preset.
func (s Semantics) ProducerOptions() []kgo.Opt {
	switch s {
	case AtMostOnce:
		return []kgo.Opt{
			kgo.DisableIdempotentWrite(),
			kgo.RequiredAcks(kgo.LeaderAck()),
			kgo.RecordRetries(0),
		}
	case AtLeastOnce:
		return []kgo.Opt{
			kgo.DisableIdempotentWrite(),
			kgo.RequiredAcks(kgo.AllISRAcks()),
		}
	case ExactlyOnce:
		return []kgo.Opt{
			kgo.RequiredAcks(kgo.AllISRAcks()),
		}
	}
	return nil
}

// ConsumerOptions returns the franz-go group-consumer options that define s;
// add kgo.ConsumerGroup and kgo.ConsumeTopics. Every preset disables
// auto-commit: when offsets are committed relative to
// processing is what tells the semantics apart, so the [Processor] commits
// them itself.
func (s Semantics) ConsumerOptions() []kgo.Opt {
	switch s {
	case AtMostOnce, AtLeastOnce:
		return []kgo.Opt{kgo.DisableAutoCommit()}
	case ExactlyOnce:
		return []kgo.Opt{
			kgo.DisableAutoCommit(),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		}
	}
	return nil
}

// Role says what a client is checked as by [Semantics.Check].
type Role int8

const (
	RoleProducer Role = iota + 1 // writes records
	RoleConsumer                 // reads records in a group and commits offsets
)

// Check reports the first setting of cl that contradicts s for the given
// roles, as a *[eoskit.ConfigError] naming it. Use it on a client built from
// [Semantics.ProducerOptions] or [Semantics.ConsumerOptions] plus your own
// options, to catch an option of yours that silently weakened the preset.
func (s Semantics) Check(cl *kgo.Client, roles ...Role) error {
	if !s.valid() {
		return &eoskit.ConfigError{Package: "eos", Setting: "Semantics", Reason: fmt.Sprintf("unknown value %d", int8(s))}
	}
	for _, r := range roles {
		var err error
		switch r {
		case RoleProducer:
			err = s.checkProducer(cl)
		case RoleConsumer:
			err = s.checkConsumer(cl)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s Semantics) checkProducer(cl *kgo.Client) error {
	acks, _ := cl.OptValue(kgo.RequiredAcks).(kgo.Acks)
	noIdempotence, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool)
	txnValues := cl.OptValues(kgo.TransactionalID)
	hasTxnID := len(txnValues) == 2 && txnValues[1] == true
	retries, _ := cl.OptValue(kgo.RecordRetries).(int64)

	fail := func(setting, reason string) error {
		return &eoskit.ConfigError{Package: "eos", Setting: setting, Semantics: checkedAgainst(s), Reason: reason}
	}
	switch s {
	case AtMostOnce:
		if hasTxnID {
			return fail("TransactionalID", "a transactional producer retries and commits atomically; at-most-once promises neither")
		}
		if retries != 0 {
			return fail("RecordRetries", "at-most-once must not retry a record (a retry after a lost acknowledgement writes it twice)")
		}
	case AtLeastOnce:
		if acks != kgo.AllISRAcks() {
			return fail("RequiredAcks", "at-least-once needs acks=all: a record acknowledged by the leader alone is lost if the leader fails")
		}
		if retries == 0 {
			return fail("RecordRetries", "at-least-once must retry failed records")
		}
	case ExactlyOnce:
		if noIdempotence {
			return fail("DisableIdempotentWrite", "exactly-once needs idempotent writes: without them a retry duplicates a record")
		}
		if acks != kgo.AllISRAcks() {
			return fail("RequiredAcks", "exactly-once needs acks=all (idempotence requires it)")
		}
	}
	return nil
}

func (s Semantics) checkConsumer(cl *kgo.Client) error {
	autoCommitOff, _ := cl.OptValue(kgo.DisableAutoCommit).(bool)
	isolation, _ := cl.OptValue(kgo.FetchIsolationLevel).(int8)
	interval, _ := cl.OptValue(kgo.AutoCommitInterval).(time.Duration)

	fail := func(setting, reason string) error {
		return &eoskit.ConfigError{Package: "eos", Setting: setting, Semantics: checkedAgainst(s), Reason: reason}
	}
	if !autoCommitOff {
		switch s {
		case AtMostOnce:
			return fail("DisableAutoCommit", fmt.Sprintf("auto-commit (every %s) may commit after processing; at-most-once commits before", interval))
		case AtLeastOnce:
			return fail("DisableAutoCommit", fmt.Sprintf("auto-commit (every %s) may commit offsets of records not yet processed, losing them on a crash", interval))
		case ExactlyOnce:
			return fail("DisableAutoCommit", "exactly-once commits offsets inside the transaction; auto-commit would commit them outside it")
		}
	}
	if s == ExactlyOnce && isolation != 1 {
		return fail("FetchIsolationLevel", "exactly-once must read with read_committed, or it consumes records of aborted transactions")
	}
	return nil
}
