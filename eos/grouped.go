package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/changelog"
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
	rekey, agg  *Processor
	conn        []kgo.Opt
	repartition string
	purge       time.Duration // PurgeRepartition's; 0: none
	logger      *slog.Logger
}

// NewGrouped returns the grouped aggregation of handler by key, through
// the repartition topic. opts are the aggregation's, as NewProcessor
// takes them: [Topics] the input, [Group], [TransactionalID] and
// [Changelog] (required; its partition count the repartition topic's),
// and the others ([OnHandlerError], [ClientOptions], ...), which apply to
// both processors, but [WithGlobalTables] (the aggregating one's only)
// and [RequireKeyPartitioning] (refused: the aggregating processor checks
// its input itself). The re-keying processor runs in group Group+
// "-repartition" with transactional id TransactionalID+"-repartition":
// the principal needs Read on that group and Write on that id as on the
// others. The repartition topic must exist (eos creates none), with the
// changelog's partition count, and be no input, nor compacted (Run
// refuses it; keep retention.ms=-1, or longer than any outage: a record
// deleted before it is counted is lost; [PurgeRepartition] deletes what
// was counted); the re-keying processor needs
// Write on it, the aggregating one Read. A partitioner in ClientOptions
// that does not place records by key is refused. A re-keyed record keeps
// its value, headers and timestamp (a windowed aggregation sees its
// event time; not on a repartition topic of
// message.timestamp.type=LogAppendTime). The user's partition callbacks
// and hooks serve both processors' clients. An error from key, or a nil key, is the record's
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
	case slices.Contains(c.inputTopics, c.state.changelog) || slices.Contains(c.inputTopics, c.state.updates):
		return nil, refuse("the changelog or the updates topic is an input: every update would be counted again")
	case c.keyPartitioner != nil:
		return nil, refuse("RequireKeyPartitioning: the aggregating processor checks its repartition topic against the re-keying producer's partitioner itself")
	case c.purgeSet && c.purge <= 0:
		return nil, &eoskit.ConfigError{Package: "eos", Setting: "PurgeRepartition", Semantics: checkedAgainst(c.semantics),
			Reason: "the interval must be positive (leave the option out for no purge)"}
	}
	purge := c.purge
	c.purge, c.purgeSet = 0, false // the Grouped's, not its processors'
	rk := *c
	rk.state, rk.keyPartitioner, rk.tables, rk.joined, rk.endpointSet = nil, nil, nil, nil, false // the aggregation's
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
	// A new group starts at the topic's start, whatever the options say:
	// the re-keying processor may commit records before it joins.
	ag.clientOpts = append(slices.Clone(c.clientOpts), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	agg, err := newProcessor(&ag, handler)
	if err != nil {
		return nil, err
	}
	// The re-keying producer's partitioner (the client options', or
	// franz-go's default), learnt by newProcessor.
	if !keyConsistent(ag.state.others.ForTopic(repartition)) {
		return nil, refuse("the producer's partitioner (ClientOptions) does not place records by their keys: a key's records would be counted in several partitions")
	}
	agg.handler = withKeyPartitioning(agg.handler, ag.state.others, agg.state.partitionCount)
	return &Grouped{rekey: rekey, agg: agg, conn: c.connOpts(), repartition: repartition, purge: purge, logger: c.logger}, nil
}

// keyConsistent reports whether tp places a keyed record by its key alone:
// it must keep a key's records together, and not follow the partition a
// record names (kgo.ManualPartitioner).
func keyConsistent(tp kgo.TopicPartitioner) bool {
	a := &kgo.Record{Key: []byte("eoskit"), Partition: 0}
	b := &kgo.Record{Key: []byte("eoskit"), Partition: 1}
	return tp.RequiresConsistency(a) && partitionOf(tp, a, 2) == partitionOf(tp, b, 2)
}

// checkRepartition refuses a repartition topic that would drop records
// before they are counted (compacted: records of one key compacted
// away), and warns of one whose retention may.
func (g *Grouped) checkRepartition(ctx context.Context) error {
	sh, err := changelog.Configs(ctx, g.conn, g.repartition)
	switch {
	case authz.Refused(err):
		g.logger.Warn("eos: may not describe the repartition topic's configs: its cleanup policy and retention are unchecked; grant DescribeConfigs on it to check them", "topic", g.repartition)
		return nil
	case err != nil:
		return fmt.Errorf("eos: describe the repartition topic %q: %w", g.repartition, err)
	case strings.Contains(sh.CleanupPolicy, "compact"):
		return &eoskit.ConfigError{Package: "eos", Setting: "NewGrouped", Reason: fmt.Sprintf(
			"the repartition topic %q is compacted (cleanup.policy=%s): records of one key would be compacted away before they are counted; use cleanup.policy=delete", g.repartition, sh.CleanupPolicy)}
	case sh.RetentionMs >= 0:
		g.logger.Warn("eos: the repartition topic deletes records by age: an aggregating processor stopped longer than its retention, or records re-keyed with old timestamps, lose records uncounted; retention.ms=-1 keeps them",
			"topic", g.repartition, "retention_ms", sh.RetentionMs)
	}
	return nil
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
		return []*kgo.Record{{Topic: topic, Key: k, Value: r.Value, Headers: slices.Clone(r.Headers), Timestamp: r.Timestamp}}, nil
	}
}

// Run checks the repartition topic (a compacted one is a
// *[eoskit.ConfigError]; one that deletes records by age is logged), then
// runs both processors until ctx ends ([RunTogether]), and with
// [PurgeRepartition] the purge beside them: a purge refused ends them, and
// Run returns its *[eoskit.AuthorizationError] (joined with the
// processors' *[TogetherError], if they failed too: use errors.As).
func (g *Grouped) Run(ctx context.Context) error {
	if err := g.checkRepartition(ctx); err != nil {
		return err
	}
	p, closePurger, err := g.newPurger()
	if err != nil {
		return err
	}
	defer closePurger()
	if p == nil {
		return RunTogether(ctx, g.rekey, g.agg)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	purged := make(chan error, 1)
	go func() {
		err := p.run(ctx)
		cancel()
		purged <- err
	}()
	err = RunTogether(ctx, g.rekey, g.agg)
	cancel()
	switch perr := <-purged; {
	case perr == nil:
		return err
	case err == nil:
		return perr
	default:
		return errors.Join(perr, err)
	}
}

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
	te := &TogetherError{Errs: make([]error, len(procs)), Groups: make([]string, len(procs))}
	for i, p := range procs {
		te.Groups[i] = p.cfg.group
	}
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
	// Groups is each processor's consumer group, in the same order: the
	// message names the processor by it (a Grouped's re-keying one is in
	// Group+"-repartition").
	Groups []string
}

func (e *TogetherError) Error() string {
	var msgs []string
	for i, err := range e.Errs {
		switch {
		case err == nil:
		case i < len(e.Groups) && e.Groups[i] != "":
			msgs = append(msgs, fmt.Sprintf("processor %d (group %s): %v", i, e.Groups[i], err))
		default:
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
