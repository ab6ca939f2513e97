package eos

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/topiccheck"
)

// checkDeadLetterTopic returns a *[eoskit.ConfigError] when the error policy
// dead-letters to a topic the cluster does not have. A missing topic is no
// record's fault and waiting will not create it (eos never creates
// topics): reported when Run starts, it costs a metadata request (Describe
// on the topic only); found at the first dead letter, it cost every
// attempt's metadata retries (77 s measured). When the cluster cannot be
// asked, or refuses the look-up, it returns nil and the sessions meet the
// outage, or the missing ACL, as usual.
func (p *Processor) checkDeadLetterTopic(ctx context.Context) error {
	topics := p.cfg.onError.DeadLetterTopics()
	if len(topics) == 0 {
		return nil
	}
	missing, err := topiccheck.Missing(ctx, p.cfg.connOpts(), topics...)
	if err != nil {
		p.logger.Debug("eos: could not check the dead-letter topics at start", "dead_letter_topics", topics, "err", err)
		return nil
	}
	if missing >= 0 {
		return p.missingDeadLetterTopic(topics[missing], kerr.UnknownTopicOrPartition)
	}
	return nil
}

// missingDeadLetterTopic is the *[eoskit.ConfigError] for a dead-letter topic the
// cluster lacks, at the start or deleted under a running processor.
func (p *Processor) missingDeadLetterTopic(topic string, err error) error {
	return &eoskit.ConfigError{Package: "eos", Setting: "OnHandlerError", Semantics: checkedAgainst(p.cfg.semantics),
		Reason: fmt.Sprintf("the dead-letter topic %q does not exist: create it (eos creates no topics)", topic), Err: err}
}
