package eos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

// Grouped is an aggregation by a key derived from each record rather than
// the record's own key, as Kafka Streams' groupBy: two processors run as
// one. The first re-keys each input record by key(r) and produces it to
// the repartition topic, partitioned by that key; the second reads the
// repartition topic and runs the aggregation's handler with its keyed
// state. Each is exactly once (its outputs, state and offsets commit in
// its own transaction), so the pair is: a record is re-keyed once, and
// counted once.
//
// An aggregation keeps each input partition's state apart: aggregated
// straight from an input partitioned by another key, a derived key's
// records would be spread over partitions and counted in parts (each
// partition emitting its own partial result under the key). The
// repartition step makes that impossible: every record of a derived key
// lands in one partition of the repartition topic, and the aggregating
// processor refuses (a *[eoskit.ConfigError] from Run) a record found in
// another partition than its key's, as after partitions were added to
// the topic or another writer wrote there ([RequireKeyPartitioning]).
type Grouped struct {
	rekey, agg *Processor
}

// NewGrouped returns the grouped aggregation of handler by key, through
// the repartition topic. opts are the aggregation's, as NewProcessor
// takes them: [Topics] the input, [Group], [TransactionalID] and
// [Changelog] (required; its partition count the repartition topic's),
// and the others ([OnHandlerError], [ClientOptions], ...), which apply to
// both processors. The re-keying processor runs in group Group+
// "-repartition" with transactional id TransactionalID+"-repartition".
// The repartition topic must exist (eos creates none), with the
// changelog's partition count, and be no input; the processors need
// Write on it, and Read in the aggregating one's group. A re-keyed
// record keeps its value, headers and timestamp (a windowed aggregation
// sees its event time). An error from key, or a nil key, is the record's
// fault (see [OnHandlerError]). Records re-keyed from several input
// partitions interleave in a repartition partition: a windowed
// aggregation may find more of them late than it would in the input.
func NewGrouped(key func(r *kgo.Record) ([]byte, error), repartition string, handler HandlerFunc, opts ...ProcessorOption) (*Grouped, error) {
	refuse := func(reason string) error {
		return &eoskit.ConfigError{Package: "eos", Setting: "NewGrouped", Reason: reason}
	}
	c := newConfig(opts)
	switch {
	case key == nil:
		return nil, refuse("no key function")
	case repartition == "":
		return nil, refuse("the repartition topic is empty")
	case c.state == nil:
		return nil, refuse("a grouped aggregation keeps its state: give Changelog")
	case slices.Contains(c.inputTopics, repartition):
		return nil, refuse(fmt.Sprintf("the repartition topic %q is an input", repartition))
	case repartition == c.state.changelog || repartition == c.state.updates:
		return nil, refuse(fmt.Sprintf("the repartition topic %q is the changelog or the updates topic", repartition))
	}
	rk := *c
	rk.state, rk.keyPartitioner, rk.tables = nil, nil, nil // the aggregation's
	rk.group = c.group + "-repartition"
	if c.txnID != "" {
		rk.txnID = c.txnID + "-repartition"
	}
	rk.logger = c.logger.With("stage", "repartition")
	rekey, err := newProcessor(&rk, rekeyBy(key, repartition))
	if err != nil {
		return nil, err
	}
	ag := *c
	ag.inputTopics = []string{repartition}
	ag.logger = c.logger.With("stage", "aggregate")
	agg, err := newProcessor(&ag, handler)
	if err != nil {
		return nil, err
	}
	if ag.keyPartitioner == nil { // the re-keying processor's, learnt by newProcessor
		agg.handler = withKeyPartitioning(agg.handler, ag.state.others, func() int32 { return agg.state.partitions })
	}
	return &Grouped{rekey: rekey, agg: agg}, nil
}

// rekeyBy is the re-keying processor's handler.
func rekeyBy(key func(*kgo.Record) ([]byte, error), topic string) HandlerFunc {
	return func(_ context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		k, err := key(r)
		switch {
		case err != nil:
			return nil, fmt.Errorf("eos: the record's grouping key: %w", err)
		case k == nil:
			return nil, errors.New("eos: the record's grouping key is nil: a record is grouped under a key")
		}
		return []*kgo.Record{{Topic: topic, Key: k, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}}, nil
	}
}

// Run runs both processors until ctx ends ([RunTogether]).
func (g *Grouped) Run(ctx context.Context) error { return RunTogether(ctx, g.rekey, g.agg) }

// Health is the worse of the two processors' ([eoskit.Worst]).
func (g *Grouped) Health() eoskit.Health { return eoskit.Worst(g.rekey.Health(), g.agg.Health()) }

// State is the aggregating processor's state.
func (g *Grouped) State() *StateView { return g.agg.State() }

// Processors returns the re-keying and the aggregating processor, for
// their Health and metrics; run them with [Grouped.Run].
func (g *Grouped) Processors() (rekey, aggregate *Processor) { return g.rekey, g.agg }

// RunTogether runs procs side by side until ctx ends: the first to return
// ends the others. It returns nil when each returned nil, else a
// *[TogetherError] with each one's error.
func RunTogether(ctx context.Context, procs ...*Processor) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(procs))
	for i, p := range procs {
		go func() {
			err := p.Run(ctx)
			cancel()
			results <- result{i, err}
		}()
	}
	te := &TogetherError{Errs: make([]error, len(procs))}
	failed := false
	for range procs {
		r := <-results
		te.Errs[r.i] = r.err
		failed = failed || r.err != nil
	}
	if !failed {
		return nil
	}
	return te
}

// TogetherError is what [RunTogether] returns when a processor's Run
// returned an error: each processor's error, in the order given (nil for
// one that returned nil). errors.Is and errors.As look into each, so
// errors.Is(err, ErrFenced) holds when any was fenced: look at Errs to
// tell an instance replaced whole (each error nil or ErrFenced) from one
// that also failed.
type TogetherError struct {
	Errs []error
}

func (e *TogetherError) Error() string {
	var msgs []string
	for i, err := range e.Errs {
		if err != nil {
			msgs = append(msgs, fmt.Sprintf("processor %d: %v", i, err))
		}
	}
	return strings.Join(msgs, "; ")
}

// Unwrap returns the errors of Errs that are not nil.
func (e *TogetherError) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
