// Package producerresume is exactly-once production without transactions:
// the source of one region's case reports is the only writer of its
// partition and writes in order, so the partition's last record says how
// far it got. After a send whose outcome it does not know (a lost
// acknowledgement, a timeout), it reads that record and resends only if
// the report is not there; after a crash, it reads it and goes on after it.
//
// What it guarantees: each report is in the partition once, in the source's
// order, for a reader at any isolation level, whatever the unknown
// outcomes and crashes of the source.
//
// What breaks it: a second writer of the partition (the last record is
// then not necessarily this source's); a source that does not write in a
// fixed order (its position is not a single record); a send still in
// flight when the last record is read (Send waits for each outcome, so
// keep one Send at a time per Producer); two reports with the same ID.
//
// cmd/producerresume is the program to deploy.
package producerresume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/patterns/dashboard"
)

// ErrLastRecordDeleted is Last's error when the partition was written to
// but holds no record any more (retention deleted them all, or
// DeleteRecords did): how far the source got cannot be read from it. Keep
// the partition's retention longer than the source's longest pause, or
// give the source its position some other way.
var ErrLastRecordDeleted = errors.New("producerresume: the partition's records were all deleted, so how far the source got cannot be read from it")

// Config is one source's configuration.
type Config struct {
	// Brokers are the Kafka bootstrap addresses.
	Brokers []string
	// Topic and Partition are where this source writes, as their only
	// writer.
	Topic     string
	Partition int32
	// Produce sends one record and waits for its outcome. Default:
	// ProduceSync on the Producer's idempotent client, which waits past
	// ctx's end for a record already sent. A Produce that returns an
	// error while the record may still be written (one that gives up
	// when ctx ends) makes Send read the previous report as the last and
	// write this one again: a duplicate.
	Produce func(ctx context.Context, r *kgo.Record) error
}

// Producer writes one source's reports to its partition.
type Producer struct {
	cfg Config
	cl  *kgo.Client
}

// New returns the producer cfg describes. Close it when done.
func New(cfg Config) (*Producer, error) {
	opts := append(eos.ExactlyOnce.ProducerOptions(), // idempotent: no duplicates from the client's own retries
		kgo.SeedBrokers(cfg.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("producerresume: %w", err)
	}
	p := &Producer{cfg: cfg, cl: cl}
	if p.cfg.Produce == nil {
		p.cfg.Produce = func(ctx context.Context, r *kgo.Record) error { return cl.ProduceSync(ctx, r).FirstErr() }
	}
	return p, nil
}

// Close closes the producer's client.
func (p *Producer) Close() { p.cl.Close() }

// Send writes rep to the partition once. If the outcome of the send is
// unknown, it reads the partition's last record, and resends only if that
// is not rep.
func (p *Producer) Send(ctx context.Context, rep dashboard.Report) error {
	err := p.cfg.Produce(ctx, p.record(rep))
	if err == nil {
		return nil
	}
	last, lastErr := p.Last(ctx)
	if lastErr != nil {
		return fmt.Errorf("producerresume: send %s: %w (and the last record could not be read: %w)", rep.ID, err, lastErr)
	}
	if last == rep.ID {
		return nil // written; only the acknowledgement was lost
	}
	if err := p.cfg.Produce(ctx, p.record(rep)); err != nil {
		return fmt.Errorf("producerresume: resend %s: %w", rep.ID, err)
	}
	return nil
}

func (p *Producer) record(rep dashboard.Report) *kgo.Record {
	r := rep.Record(p.cfg.Topic)
	r.Partition = p.cfg.Partition
	return r
}

// Last returns the ID of the last report in the partition ("" if it is
// empty): how far this source got. It waits at most 30 s for the record.
func (p *Producer) Last(ctx context.Context) (string, error) {
	topic, partition := p.cfg.Topic, p.cfg.Partition
	ends, err := kadm.NewClient(p.cl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return "", fmt.Errorf("producerresume: end offsets: %w", err)
	}
	end, ok := ends.Lookup(topic, partition)
	if !ok || end.Offset == 0 {
		return "", nil
	}
	starts, err := kadm.NewClient(p.cl).ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return "", fmt.Errorf("producerresume: start offsets: %w", err)
	}
	if start, ok := starts.Lookup(topic, partition); ok && start.Offset >= end.Offset {
		return "", fmt.Errorf("%w: %s[%d] holds no record (its start and end offsets are %d)", ErrLastRecordDeleted, topic, partition, end.Offset)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(end.Offset - 1)}}))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		f := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("producerresume: read the last record of %s[%d]: %w", topic, partition, err)
		}
		for _, r := range f.Records() {
			rep, err := dashboard.Parse(r.Value)
			if err != nil {
				return "", err
			}
			return rep.ID, nil
		}
		if errs := f.Errors(); len(errs) > 0 {
			return "", errors.Join(errs[0].Err)
		}
	}
}
