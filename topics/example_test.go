package topics_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/topics"
)

// Before the first deploy of an outbox relay and the service that
// consumes its topic: the relay's position topic (one partition,
// compacted) and the orders topic, created if missing, refused if they
// exist with another shape.
func ExampleEnsure() {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:9092"))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	_, err = topics.Ensure(context.Background(), kadm.NewClient(cl),
		outbox.PositionTopicSpec(outbox.DefaultPositionTopic),
		topics.Spec{Name: "orders", Partitions: 12, ReplicationFactor: 3})
	if ce, ok := errors.AsType[*topics.ConflictError](err); ok {
		fmt.Println("fix the topic by hand:", ce)
	}
}
