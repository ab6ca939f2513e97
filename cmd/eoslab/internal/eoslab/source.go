package eoslab

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/producerresume"
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
	// resume is the pattern producerresume: it reads the last record of
	// the partition and resends only if it is not there; exactly-once,
	// without transactions, for one producer per partition.
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

// errUnknownOutcome is what the lab's source sees for a report whose
// outcome it made unknown.
var errUnknownOutcome = errors.New("eoslab: the outcome of the send is unknown")

// source writes reports to topic, one partition per region, suffering an
// unknown outcome every lostEvery reports of the workload and reacting with
// policy (for resume, through the pattern producerresume, one producer per
// region); first is the workload index of reports[0], so that the faults
// fall on the same reports however the workload is split. With stamp, each
// report carries a message id (dedup.Stamp) that its resends keep.
func source(ctx context.Context, brokers []string, topic string, reports []dashboard.Report, first, lostEvery int, policy sourcePolicy, sem eos.Semantics, stamp bool) error {
	opts := append(sem.ProducerOptions(), kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	// produce sends a record, except that the first send of a report
	// whose fault is pending has an unknown outcome: written with the
	// acknowledgement lost, or never written.
	var pending unknownOutcome
	produce := func(ctx context.Context, rec *kgo.Record) error {
		fault := pending
		pending = noFault
		if fault != notWritten {
			if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
				return err
			}
		}
		if fault != noFault {
			return errUnknownOutcome
		}
		return nil
	}
	resumers := map[string]*producerresume.Producer{}
	if policy == resume {
		for _, region := range regions {
			p, err := producerresume.New(producerresume.Config{Brokers: brokers, Topic: topic, Partition: regionPartition(region), Produce: produce})
			if err != nil {
				return err
			}
			defer p.Close()
			resumers[region] = p
		}
	}
	for i, rep := range reports {
		pending = faultFor(first+i, lostEvery)
		if policy == resume {
			if err := resumers[rep.Region].Send(ctx, rep); err != nil {
				return fmt.Errorf("source: %w", err)
			}
			continue
		}
		rec := rep.Record(topic)
		rec.Partition = regionPartition(rep.Region)
		if stamp {
			dedup.Stamp(rec)
		}
		err := produce(ctx, rec)
		if errors.Is(err, errUnknownOutcome) {
			switch policy {
			case giveUp:
				err = nil
			case resend:
				err = produce(ctx, copyRecord(rec))
			}
		}
		if err != nil {
			return fmt.Errorf("source: produce %s: %w", rep.ID, err)
		}
	}
	return nil
}

func copyRecord(r *kgo.Record) *kgo.Record {
	return &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Partition: r.Partition, Headers: r.Headers}
}
