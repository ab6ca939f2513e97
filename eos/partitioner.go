package eos

import "github.com/twmb/franz-go/pkg/kgo"

// changelogPartitioner writes a stateful processor's changelog records to
// the partition they name (the input partition whose state they hold),
// and every other record as the client's partitioner would (franz-go's
// default, or the one given in ClientOptions).
type changelogPartitioner struct {
	changelog string
	others    kgo.Partitioner
}

func (c changelogPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if topic == c.changelog {
		return kgo.ManualPartitioner().ForTopic(topic)
	}
	return c.others.ForTopic(topic)
}
