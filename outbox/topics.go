package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/topiccheck"
)

// checkTopics makes sure the topics the relay writes to on its own
// account exist: the position topic (exactly-once) and the dead-letter
// topic, if one is set. A missing one is an *eoskit.ConfigError naming its
// setting, at once: the relay does not create topics (that would need
// admin rights), so retrying would not cure it. Run calls it at the start
// of every session, and again when a produce to one of them fails as
// UNKNOWN_TOPIC_OR_PARTITION (the topic deleted since).
func (c *config) checkTopics(ctx context.Context) error {
	var topics, settings []string
	if c.semantics == eos.ExactlyOnce {
		topics, settings = append(topics, c.positionTopic), append(settings, "PositionTopic")
	}
	if c.deadLetter != "" && c.deadLetter != c.positionTopic {
		topics, settings = append(topics, c.deadLetter), append(settings, "DeadLetter")
	}
	if len(topics) == 0 {
		return nil
	}
	missing, err := topiccheck.Missing(ctx, c.connOpts(), topics...)
	switch {
	case err != nil:
		return fmt.Errorf("outbox: %w", err)
	case missing >= 0:
		return &eoskit.ConfigError{Package: "outbox", Setting: settings[missing], Semantics: c.semantics.String(),
			Reason: fmt.Sprintf("topic %q does not exist; create it (the relay never creates topics)", topics[missing]), Err: kerr.UnknownTopicOrPartition}
	}
	return nil
}

// topicGone returns the *eoskit.ConfigError of checkTopics when err is a
// produce to the position topic or the dead-letter topic that failed as
// UNKNOWN_TOPIC_OR_PARTITION and a fresh look-up confirms the topic is
// gone; nil otherwise (a metadata glitch, say, which the session's retry
// rides out).
func (c *config) topicGone(ctx context.Context, err error) error {
	pe, ok := errors.AsType[*eos.ProduceError](err)
	if !ok || !errors.Is(pe.Err, kerr.UnknownTopicOrPartition) ||
		pe.Topic != c.positionTopic && (c.deadLetter == "" || pe.Topic != c.deadLetter) {
		return nil
	}
	if cerr, ok := errors.AsType[*eoskit.ConfigError](c.checkTopics(ctx)); ok {
		return cerr
	}
	return nil
}

// partitionMissing is the cause to blame a record pinned to partition of
// topic for, which the producer refused as out of range (cause). The
// producer's metadata may lag partitions just added, so a fresh look-up
// decides: a partition the topic does not have is the record's fault
// (ErrInvalidPartition, dead-lettered or final like a too-large record);
// otherwise, or if the look-up fails, cause stays as it is, not the
// record's fault, and the session is retried with a new producer (and
// its fresh metadata).
func (c *config) partitionMissing(ctx context.Context, topic string, partition int32, cause error) error {
	md, err := topiccheck.Describe(ctx, c.connOpts(), topic)
	if err != nil {
		c.logger.Warn("outbox: could not look up the partitions of a pinned record's topic", "topic", topic, "partition", partition, "err", err)
		return cause
	}
	td, ok := md[topic]
	if !ok || td.Err != nil {
		return cause // a missing topic, say: not this partition's fault
	}
	if _, has := td.Partitions[partition]; has {
		return cause
	}
	return fmt.Errorf("%w (it has %d): %w", ErrInvalidPartition, len(td.Partitions), cause)
}
