// Package preset holds the delivery presets (eos.Semantics) below every
// runner: the franz-go options that define at-most-once, at-least-once
// and exactly-once, and the checks that find an option contradicting
// them. eos exports them as eos.Semantics; the consume core (offsetstore,
// dedup) uses the exactly-once consumer preset without importing eos.
package preset

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Semantics is a delivery guarantee; eos.Semantics has the same values.
type Semantics int8

// The presets, in eos.Semantics' order.
const (
	AtMostOnce Semantics = iota + 1
	AtLeastOnce
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

// Valid reports whether s is one of the presets.
func (s Semantics) Valid() bool { return s >= AtMostOnce && s <= ExactlyOnce }

// Refusal is a setting that contradicts a preset, and why; the runner
// makes it a *eoskit.ConfigError of its package.
type Refusal struct{ Setting, Reason string }

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
// processing is what tells the semantics apart, so a runner commits
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

func (s Semantics) CheckProducer(cl *kgo.Client) *Refusal {
	acks, _ := cl.OptValue(kgo.RequiredAcks).(kgo.Acks)
	noIdempotence, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool)
	txnValues := cl.OptValues(kgo.TransactionalID)
	hasTxnID := len(txnValues) == 2 && txnValues[1] == true
	retries, _ := cl.OptValue(kgo.RecordRetries).(int64)

	fail := func(setting, reason string) *Refusal { return &Refusal{Setting: setting, Reason: reason} }
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

func (s Semantics) CheckConsumer(cl *kgo.Client) *Refusal {
	autoCommitOff, _ := cl.OptValue(kgo.DisableAutoCommit).(bool)
	isolation, _ := cl.OptValue(kgo.FetchIsolationLevel).(int8)
	interval, _ := cl.OptValue(kgo.AutoCommitInterval).(time.Duration)

	fail := func(setting, reason string) *Refusal { return &Refusal{Setting: setting, Reason: reason} }
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
