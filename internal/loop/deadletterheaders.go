package loop

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The headers eoskit puts on a dead letter in Kafka: eos's say where the
// input was read and why it failed; the outbox relay's, which outbox row
// it was and the topic it was meant for.
const (
	HeaderError           = "eoskit-error"
	HeaderSourceTopic     = "eoskit-source-topic"
	HeaderSourcePartition = "eoskit-source-partition"
	HeaderSourceOffset    = "eoskit-source-offset"
	HeaderOutboxID        = "eoskit-outbox-id"
	HeaderOutboxTopic     = "eoskit-outbox-topic"
	HeaderOutboxError     = "eoskit-outbox-error"
	HeaderOutboxValue     = "eoskit-outbox-value"
)

// IsDeadLetterHeader reports whether key is one of the headers eoskit
// puts on a dead letter.
func IsDeadLetterHeader(key string) bool {
	switch key {
	case HeaderError, HeaderOutboxID, HeaderOutboxTopic, HeaderOutboxError, HeaderOutboxValue:
		return true
	}
	return strings.HasPrefix(key, "eoskit-source-")
}

// WithoutDeadLetterHeaders returns a copy of hs without the headers eoskit
// puts on a dead letter: a record's producer chose them, and a dead letter
// that kept them beside eoskit's own could send its replay to another
// topic (an input carrying eoskit-source-topic: payments) or block it.
func WithoutDeadLetterHeaders(hs []kgo.RecordHeader) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, 0, len(hs))
	for _, h := range hs {
		if !IsDeadLetterHeader(h.Key) {
			out = append(out, h)
		}
	}
	return out
}
