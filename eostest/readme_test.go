package eostest_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eostest"
)

// TestOrdersAreReadBack is the example test of
// docs/testing-your-application.md, word for word:
// TestREADMEShowsTheExampleTest keeps the two the same.
func TestOrdersAreReadBack(t *testing.T) {
	brokers := eostest.Kafka(t) // KAFKA_BROKERS, else a container, else skip
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topic := "orders-" + time.Now().Format("150405.000000")
	if resp, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, topic); err != nil || resp.Err != nil {
		t.Fatal(err, resp.Err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("order-1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	reader, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	fetches := reader.PollFetches(ctx)
	if err := fetches.Err(); err != nil {
		t.Fatal(err)
	}
	if recs := fetches.Records(); len(recs) != 1 || string(recs[0].Value) != "order-1" {
		t.Fatalf("read %d records, want the one order-1", len(recs))
	}
}
