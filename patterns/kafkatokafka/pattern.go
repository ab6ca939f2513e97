// Package kafkatokafka is the exactly-once Kafka→Kafka pattern: an
// eos.Processor reads case reports from an input topic and publishes each
// one, checked and keyed by its region, to the dashboard's feed topic, with
// the outputs and the input offsets committed in one Kafka transaction.
//
// What it guarantees: a read_committed reader of the output (the dashboard)
// sees each input report exactly once, whatever the crashes, rebalances
// and stalled instances in between: a batch's outputs and its offsets
// commit together or not at all, and an instance stalled past its session
// timeout is fenced by its replacement (same Instance, so the same
// transactional id) before it can commit.
//
// What breaks it: a reader that reads uncommitted (it sees aborted
// outputs); a handler with side effects outside Kafka (a database write or
// an HTTP call is repeated when a transaction aborts and its batch is read
// again: use kafkatopostgres for a database); an Instance that changes on
// restart (nothing is fenced); a producer upstream that duplicates (the
// processor copies each input once, duplicates included: feed it an
// idempotent, transactional or resume producer).
//
// cmd/kafkatokafka is the program to deploy.
package kafkatokafka

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/patterns/dashboard"
)

// Config is one instance's configuration.
type Config struct {
	// Brokers are the Kafka bootstrap addresses.
	Brokers []string
	// Group is the consumer group, shared by every instance; it also
	// prefixes the transactional id.
	Group string
	// Instance names the slot this process fills, the same after a
	// restart (a StatefulSet pod name, an ordinal): with Group it makes
	// the transactional id that fences a stalled predecessor.
	Instance string
	// Input is the topic of incoming reports; Output the dashboard's feed.
	Input, Output string
	// Handler turns one input record into its outputs. Default:
	// Forward(Output).
	Handler eos.HandlerFunc
	// Logger receives the processor's logs. Default: slog.Default().
	Logger *slog.Logger
	// Options are further processor options (eos.CommitInterval,
	// eos.DrainTimeout, eos.ClientOptions...), applied after the
	// pattern's own.
	Options []eos.ProcessorOption
}

// Forward is the pattern's handler: it checks each input is a report and
// publishes it to topic, keyed by its region. A record that is not a report
// is an error, which stops the processor (eos.OnHandlerError chooses
// otherwise, a dead-letter topic say).
func Forward(topic string) eos.HandlerFunc {
	return func(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		rep, err := dashboard.Parse(in.Value)
		if err != nil {
			return nil, err
		}
		return []*kgo.Record{rep.Record(topic)}, nil
	}
}

// Run runs the processor until ctx ends, then drains: it lets the batch in
// hand finish and commits it (eos.DrainTimeout bounds that), and returns
// nil. It returns eos.ErrFenced when a newer instance with the same Group
// and Instance took over.
func Run(ctx context.Context, cfg Config) error {
	txnID, err := eos.StableTransactionalID(cfg.Group, cfg.Instance)
	if err != nil {
		return fmt.Errorf("kafkatokafka: %w", err)
	}
	handler, logger := cfg.Handler, cfg.Logger
	if handler == nil {
		handler = Forward(cfg.Output)
	}
	if logger == nil {
		logger = slog.Default()
	}
	opts := append([]eos.ProcessorOption{
		eos.Brokers(cfg.Brokers...),
		eos.Group(cfg.Group),
		eos.Topics(cfg.Input),
		eos.WithSemantics(eos.ExactlyOnce), // the default, said aloud
		eos.TransactionalID(txnID),
		eos.Logger(logger),
	}, cfg.Options...)
	proc, err := eos.NewProcessor(handler, opts...)
	if err != nil {
		return err
	}
	return proc.Run(ctx)
}
