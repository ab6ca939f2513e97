package eoslab

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/patterns/dashboard"
)

// sourcePolicy is what a producer does when it can not know whether a
// record was written (a lost acknowledgement, a timeout).
type sourcePolicy int8

const (
	// giveUp moves on: at-most-once. A record that was not written is lost.
	giveUp sourcePolicy = iota
	// resend sends the record again: at-least-once. A record that was
	// written is written twice.
	resend
	// resume reads the last record of the partition and resends only if
	// it is not there: exactly-once, without transactions, for one
	// producer per partition.
	resume
)

// unknownOutcome is the fault a source suffers for some reports: either
// the record was written and its acknowledgement lost, or it was never
// written and the request timed out. Either way the producer only sees that
// it does not know.
type unknownOutcome int8

const (
	noFault unknownOutcome = iota
	writtenAckLost
	notWritten
)

// faultFor alternates the two kinds of unknown outcome over every
// lostEvery-th report.
func faultFor(i, lostEvery int) unknownOutcome {
	if lostEvery <= 0 || i%lostEvery != lostEvery/2 {
		return noFault
	}
	if (i/lostEvery)%2 == 0 {
		return writtenAckLost
	}
	return notWritten
}

// source writes reports to topic, one partition per region, suffering an
// unknown outcome every lostEvery reports of the workload and reacting with
// policy; first is the workload index of reports[0], so that the faults
// fall on the same reports however the workload is split. With stamp, each
// report carries a message id (dedup.Stamp) that its resends keep.
func source(ctx context.Context, brokers []string, topic string, reports []dashboard.Report, first, lostEvery int, policy sourcePolicy, sem eos.Semantics, stamp bool) error {
	opts := append(sem.ProducerOptions(), kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for i, rep := range reports {
		rec := &kgo.Record{Key: []byte(rep.Region), Value: rep.Value(), Partition: regionPartition(rep.Region)}
		if stamp {
			dedup.Stamp(rec)
		}
		fault := faultFor(first+i, lostEvery)
		if fault != notWritten {
			if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
				return fmt.Errorf("source: produce %s: %w", rep.ID, err)
			}
		}
		if fault == noFault {
			continue
		}
		switch policy {
		case giveUp:
		case resend:
			if err := cl.ProduceSync(ctx, copyRecord(rec)).FirstErr(); err != nil {
				return fmt.Errorf("source: resend %s: %w", rep.ID, err)
			}
		case resume:
			last, err := lastReport(ctx, brokers, topic, rec.Partition)
			if err != nil {
				return err
			}
			if last != rep.ID {
				if err := cl.ProduceSync(ctx, copyRecord(rec)).FirstErr(); err != nil {
					return fmt.Errorf("source: resend %s: %w", rep.ID, err)
				}
			}
		}
	}
	return nil
}

func copyRecord(r *kgo.Record) *kgo.Record {
	return &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Partition: r.Partition, Headers: r.Headers}
}

// lastReport returns the id of the last report in a partition ("" if it is
// empty): the resume producer's way to learn whether its last send landed.
// It is exact because this producer is the partition's only writer and
// writes in order.
func lastReport(ctx context.Context, brokers []string, topic string, partition int32) (string, error) {
	admCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return "", err
	}
	defer admCl.Close()
	ends, err := kadm.NewClient(admCl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return "", fmt.Errorf("source: end offsets: %w", err)
	}
	end, ok := ends.Lookup(topic, partition)
	if !ok || end.Offset == 0 {
		return "", nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
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
			return "", fmt.Errorf("source: read the last record of %s[%d]: %w", topic, partition, err)
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
