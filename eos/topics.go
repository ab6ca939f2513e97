package eos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// topicCheckTimeout bounds the metadata request that checks the
// dead-letter topic when Run starts.
const topicCheckTimeout = 15 * time.Second

// checkDeadLetterTopic returns a *ConfigError when the error policy
// dead-letters to a topic the cluster does not have. A missing topic is no
// record's fault and waiting will not create it (eos never creates
// topics): reported when Run starts, it costs a metadata request (Describe
// on the topic only); found at the first dead letter, it cost every
// attempt's metadata retries (77 s measured). When the cluster cannot be
// asked, it returns nil and the sessions meet the outage as usual.
func (p *Processor) checkDeadLetterTopic(ctx context.Context) error {
	pol := p.cfg.onError.p
	if !pol.DeadLetters() {
		return nil
	}
	topic := pol.DeadLetterTopic()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, p.cfg.clientOpts...), kgo.SeedBrokers(p.cfg.brokers...))...)
	if err != nil {
		return &ConfigError{Setting: "ClientOptions", Semantics: p.cfg.semantics, Reason: err.Error(), Err: err}
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, topicCheckTimeout)
	defer cancel()
	topics, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		p.logger.Debug("eos: could not check the dead-letter topic at start", "dead_letter_topic", topic, "err", err)
		return nil
	}
	if d, ok := topics[topic]; !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return missingDeadLetterTopic(topic, kerr.UnknownTopicOrPartition)
	}
	return nil
}

// missingDeadLetterTopic is the *ConfigError for a dead-letter topic the
// cluster lacks, at the start or deleted under a running processor.
func missingDeadLetterTopic(topic string, err error) error {
	return &ConfigError{Setting: "OnHandlerError",
		Reason: fmt.Sprintf("the dead-letter topic %q does not exist: create it (eos creates no topics)", topic), Err: err}
}
