package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/authz"
)

const (
	// describeTimeout bounds one metadata look-up of the relay's own topics.
	describeTimeout = 30 * time.Second
	// missingFor is how long a topic must stay missing from the
	// metadata before the relay calls it missing.
	missingFor = 2 * time.Second
)

// describeTopics returns topics' metadata from a fresh Metadata request
// (no cached answer, no auto-creation), which needs only Describe on each
// topic (Read or Write implies it): the relay never needs admin rights.
// A topic the principal may not describe is an *authz.Error.
func describeTopics(ctx context.Context, conn []kgo.Opt, topics ...string) (kadm.TopicDetails, error) {
	ctx, cancel := context.WithTimeout(ctx, describeTimeout)
	defer cancel()
	cl, err := kgo.NewClient(conn...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	md, err := kadm.NewClient(cl).Metadata(ctx, topics...)
	if ae, ok := errors.AsType[*kadm.AuthError](err); ok {
		return nil, &authz.Error{Permission: fmt.Sprintf("Describe (or Read or Write) on topics %q", topics), Err: ae.Err}
	}
	if err != nil {
		return nil, fmt.Errorf("outbox: look up topics %q (within %s): %w", topics, describeTimeout, err)
	}
	return md.Topics, nil
}

// checkTopics makes sure the topics the relay writes to on its own
// account exist: the position topic (exactly-once) and the dead-letter
// topic, if one is set. A missing one is an *eos.ConfigError naming its
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
		topics, settings = append(topics, c.deadLetter), append(settings, "DeadLetterTopic")
	}
	if len(topics) == 0 {
		return nil
	}
	// A topic just created may be missing from a broker's metadata for
	// a moment (the controller has it, the broker not yet): it is missing
	// only once every look for missingFor says so.
	var since time.Time
	for {
		md, err := describeTopics(ctx, c.connOpts(), topics...)
		if err != nil {
			return err
		}
		missing := -1
		for i, topic := range topics {
			td, ok := md[topic]
			switch {
			case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
				missing = i
			case td.Err != nil:
				return fmt.Errorf("outbox: look up topic %q (%s): %w", topic, settings[i], td.Err)
			}
		}
		switch {
		case missing < 0:
			return nil
		case since.IsZero():
			since = time.Now()
		case time.Since(since) >= missingFor:
			return &eos.ConfigError{Package: "outbox", Setting: settings[missing], Semantics: c.semantics,
				Reason: fmt.Sprintf("topic %q does not exist; create it (the relay never creates topics)", topics[missing]), Err: kerr.UnknownTopicOrPartition}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(missingFor / 8):
		}
	}
}

// topicGone returns the *eos.ConfigError of checkTopics when err is a
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
	if cerr, ok := errors.AsType[*eos.ConfigError](c.checkTopics(ctx)); ok {
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
	md, err := describeTopics(ctx, c.connOpts(), topic)
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
