package eos_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/testsupport/contract"
)

// The contracts every runner keeps (testsupport/contract): the error
// policy and its classification, the handler error shapes, the shutdown,
// the drain, health and metrics, here over an exactly-once processor
// copying its input to an output topic, dead letters to a topic.
func TestContracts(t *testing.T) {
	t.Parallel()
	contract.Run(t, contract.Subject{Features: contract.Features{DeadLetteredOnce: true}, New: func(t *testing.T) contract.World {
		k := integration.Kafka(t)
		w := &world{k: k, in: k.NewTopic(3), out: k.NewTopic(3), dlt: k.NewTopic(1), group: integration.UniqueName(t, "g")}
		w.Seeder = &contract.Seeder{Brokers: k.Brokers, Topic: w.in}
		w.settled = []*counter{followCommitted(t, k, w.out), followCommitted(t, k, w.dlt)}
		return w
	}})
}

// world is a contract's processor, topics and group.
type world struct {
	*contract.Seeder
	k            *integration.KafkaCluster
	in, out, dlt string
	group        string
	settled      []*counter
}

func (w *world) Runner(t *testing.T, s contract.Setup) contract.Runner {
	h := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if s.Handle != nil {
			if err := s.Handle(ctx, string(r.Key), r.Offset); err != nil {
				return nil, err
			}
		}
		return copyHandler(w.out)(ctx, r)
	}
	opts := append(processorOpts(w.k, w.group, w.in, "0"), eos.Logger(testLogger(t)),
		eos.ClientOptions(testClientOpts()...), eos.MaxRecordsPerCommit(50), eos.OnHandlerError(s.Policy))
	if s.DrainSet {
		opts = append(opts, eos.DrainTimeout(s.Drain))
	}
	if s.Metrics != nil {
		opts = append(opts, eos.WithMetrics(s.Metrics))
	}
	p, err := eos.NewProcessor(h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (w *world) keys(t *testing.T, topic string) []string {
	var ids []string
	for _, r := range w.k.ReadAll(topic, kgo.ReadCommitted(), verifyTimeout) {
		ids = append(ids, string(r.Key))
	}
	return ids
}

func (w *world) Effects(t *testing.T) []string      { return w.keys(t, w.out) }
func (w *world) DeadLettered(t *testing.T) []string { return w.keys(t, w.dlt) }

func (w *world) DeadLetterErrors(t *testing.T) map[string]string {
	kept := map[string]string{}
	for _, r := range w.k.ReadAll(w.dlt, kgo.ReadCommitted(), verifyTimeout) {
		for _, h := range r.Headers {
			if h.Key == "eoskit-error" {
				kept[string(r.Key)] = string(h.Value)
			}
		}
	}
	return kept
}

func (w *world) Settled(*testing.T) int {
	return int(w.settled[0].n.Load() + w.settled[1].n.Load())
}

func (w *world) DeadLetter() eoskit.ErrorPolicy { return eos.DeadLetter(w.dlt) }
