package integration_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
)

// TestOrdersAreReadBack is the example test of docs/testing-your-application.md,
// word for word: TestDocsShowTheExampleTest keeps the two the same.
func TestOrdersAreReadBack(t *testing.T) {
	k := integration.Kafka(t) // KAFKA_BROKERS, else a container, else skip
	topic := k.NewTopic(1)    // a unique name, ready on every broker, deleted at the end
	k.Produce(topic, &kgo.Record{Value: []byte("order-1")})

	recs := k.ReadAll(topic, kgo.ReadCommitted(), time.Minute)
	if len(recs) != 1 || string(recs[0].Value) != "order-1" {
		t.Fatalf("read %d records, want the one order-1", len(recs))
	}
}
