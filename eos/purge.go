package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
)

// PurgeRepartition makes a [NewGrouped] aggregation delete, every every,
// the records of its repartition topic below its aggregating group's
// committed offsets (DeleteRecords), as Kafka Streams purges its
// repartition topics: those records are counted (their offsets commit in
// the transaction of their state), so the topic keeps only what is not
// counted yet, and a retention.ms=-1 (which loses nothing however long
// the aggregation is stopped) no longer means a topic that grows for
// ever. The principal needs Delete on the repartition topic: a refusal
// ends Run with an *[eoskit.AuthorizationError] naming it; other errors
// are logged and the next purge tries again. Each instance purges every
// partition (the same offsets: a purge is idempotent). A group's offsets
// reset to before a purge (to count again) find those records gone.
// NewProcessor refuses it: it is NewGrouped's. Default: no purge (the
// topic keeps what its retention keeps). Kafka Streams purges every 30 s.
func PurgeRepartition(every time.Duration) ProcessorOption {
	return processorOpt(func(c *config) { c.purge, c.purgeSet = every, true })
}

// purger deletes a repartition topic's counted records (see
// PurgeRepartition).
type purger struct {
	topic, group string
	every        time.Duration
	adm          *kadm.Client
	logger       *slog.Logger
	// purged is each partition's offset below which records are deleted.
	purged map[int32]int64
	// failed is how many purges failed since the last that worked, warned
	// when one was last logged (a failure every interval is logged once a
	// minute).
	failed int
	warned time.Time
}

// purgeWarnEvery is how often a purge failing again is logged.
const purgeWarnEvery = time.Minute

// run purges every p.every until ctx ends (nil) or the broker refuses a
// purge (its *eoskit.AuthorizationError). It first deletes nothing (up to
// where each partition starts already): a principal without Delete on the
// topic learns it at once, not once the aggregation commits.
func (p *purger) run(ctx context.Context) error {
	if err := p.probe(ctx); refused(err) {
		return err
	} else if err != nil && ctx.Err() == nil {
		p.logger.Warn("eos: could not check the repartition purge's right to delete; the purges will tell", "topic", p.topic, "err", err)
	}
	tick := time.NewTicker(p.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		err := p.once(ctx)
		switch {
		case refused(err):
			return err
		case err == nil && p.failed > 0:
			p.logger.Info("eos: purging the repartition topic works again", "topic", p.topic, "failed_in_a_row", p.failed)
			p.failed = 0
		case err != nil && ctx.Err() == nil:
			p.failed++
			if time.Since(p.warned) >= purgeWarnEvery {
				p.logger.Warn("eos: purging the repartition topic failed; the next purge tries again", "topic", p.topic,
					"failed_in_a_row", p.failed, "err", err)
				p.warned = time.Now()
			}
		}
	}
}

// refused reports whether err is the broker's refusal of a purge.
func refused(err error) bool {
	var ae *eoskit.AuthorizationError
	return errors.As(err, &ae)
}

// once deletes the records of each partition below the group's committed
// offset, where that offset moved since the last purge.
func (p *purger) once(ctx context.Context) error {
	committed, err := p.adm.FetchOffsets(ctx, p.group)
	if err != nil {
		return fmt.Errorf("eos: fetch group %q's offsets: %w", p.group, err)
	}
	for _, o := range committed[p.topic] {
		if o.Err == nil && o.At < p.purged[o.Partition] {
			// Behind what was purged (the group's offsets reset, the
			// topic created again): purge again once it moves on.
			p.purged[o.Partition] = o.At
		}
	}
	return p.deleteBelow(ctx, purgeBelow(committed, p.topic, p.purged))
}

// probe deletes the records of each partition below where it starts: none.
// Partitions whose start could not be listed are left out.
func (p *purger) probe(ctx context.Context) error {
	starts, err := p.adm.ListStartOffsets(ctx, p.topic)
	if err != nil && len(starts) == 0 {
		return fmt.Errorf("eos: list the repartition topic's start offsets: %w", err)
	}
	at := kadm.Offsets{}
	starts.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			at.Add(kadm.Offset{Topic: o.Topic, Partition: o.Partition, At: o.Offset, LeaderEpoch: -1})
		}
	})
	if len(at) == 0 {
		return fmt.Errorf("eos: list the repartition topic's start offsets: %w", errors.Join(err, starts.Error()))
	}
	return p.deleteBelow(ctx, at)
}

// deleteBelow deletes the records below the offsets of below, and notes
// each partition's in p.purged once deleted. A refusal of any partition
// is an *eoskit.AuthorizationError, even when another broker's part of
// the request failed.
func (p *purger) deleteBelow(ctx context.Context, below kadm.Offsets) error {
	if len(below) == 0 {
		return nil
	}
	deleted, err := p.adm.DeleteRecords(ctx, below) // with a shard's error, the others' results
	if authz.Refused(err) {
		return &eoskit.AuthorizationError{Permission: "Delete on topic " + p.topic, Err: err}
	}
	errs := []error{}
	if err != nil {
		errs = append(errs, fmt.Errorf("eos: delete the repartition topic's counted records: %w", err))
	}
	for _, d := range deleted.Sorted() {
		switch {
		case authz.Refused(d.Err):
			return &eoskit.AuthorizationError{Permission: "Delete on topic " + p.topic, Err: d.Err}
		case d.Err != nil:
			errs = append(errs, fmt.Errorf("partition %d: %w", d.Partition, d.Err))
		default:
			if at, ok := below.Lookup(p.topic, d.Partition); ok && at.At > p.purged[d.Partition] {
				p.purged[d.Partition] = at.At
			}
		}
	}
	return errors.Join(errs...)
}

// purgeBelow is what a purge deletes: for each partition of topic whose
// committed offset (in committed) lies past the one already purged, the
// records below it. A partition with no committed offset, or an error,
// is left alone.
func purgeBelow(committed kadm.OffsetResponses, topic string, purged map[int32]int64) kadm.Offsets {
	below := kadm.Offsets{}
	for _, o := range committed[topic] {
		if o.Err != nil || o.At < 0 || o.At <= purged[o.Partition] { // -1 would delete up to the high watermark
			continue
		}
		below.Add(kadm.Offset{Topic: topic, Partition: o.Partition, At: o.At, LeaderEpoch: -1})
	}
	return below
}

// newPurger returns g's purger over a client of its own (close it with
// the returned function), or nil when g does not purge.
func (g *Grouped) newPurger() (*purger, func(), error) {
	if g.purge <= 0 {
		return nil, func() {}, nil
	}
	cl, err := kgo.NewClient(g.conn...)
	if err != nil {
		return nil, nil, fmt.Errorf("eos: the repartition purge's client: %w", err)
	}
	return &purger{topic: g.repartition, group: g.agg.cfg.group, every: g.purge, adm: kadm.NewClient(cl),
		logger: g.logger, purged: map[int32]int64{}}, cl.Close, nil
}
