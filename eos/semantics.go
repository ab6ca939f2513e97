package eos

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/preset"
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

func (s Semantics) String() string { return preset.Semantics(s).String() }

func (s Semantics) valid() bool { return preset.Semantics(s).Valid() }

// ProducerOptions returns the franz-go producer options that define s.
// ExactlyOnce also needs a transactional id (kgo.TransactionalID), which is
// per instance and therefore not part of the preset.
func (s Semantics) ProducerOptions() []kgo.Opt { return preset.Semantics(s).ProducerOptions() }

// ConsumerOptions returns the franz-go group-consumer options that define s;
// add kgo.ConsumerGroup and kgo.ConsumeTopics. Every preset disables
// auto-commit: when offsets are committed relative to
// processing is what tells the semantics apart, so the [Processor] commits
// them itself.
func (s Semantics) ConsumerOptions() []kgo.Opt { return preset.Semantics(s).ConsumerOptions() }

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
		var refused *preset.Refusal
		switch r {
		case RoleProducer:
			refused = preset.Semantics(s).CheckProducer(cl)
		case RoleConsumer:
			refused = preset.Semantics(s).CheckConsumer(cl)
		}
		if refused != nil {
			return &eoskit.ConfigError{Package: "eos", Setting: refused.Setting, Semantics: checkedAgainst(s), Reason: refused.Reason}
		}
	}
	return nil
}
