package eoslab

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/kafkatokafka"
	"github.com/eoskit/eoskit/patterns/producerresume"
	"github.com/eoskit/eoskit/verify"
)

// The Kafka rows: two weaker designs (controls), at-most-once and
// at-least-once, and the exactly-once pattern kafkatokafka, each consuming
// the same source through the same faults; and the resume producer alone.

func atMostOnce() Pattern {
	return Pattern{
		Name:      "at-most-once",
		Guarantee: "never retries; loses what was in flight",
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			return l.kafkaPipeline(ctx, p, eos.AtMostOnce, giveUp)
		},
	}
}

func atLeastOnce() Pattern {
	return Pattern{
		Name:      "at-least-once",
		Guarantee: "no loss; duplicates what was in flight",
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			return l.kafkaPipeline(ctx, p, eos.AtLeastOnce, resend)
		},
	}
}

func exactlyOnceKafka() Pattern {
	return Pattern{
		Name:      "exactly-once kafka→kafka",
		Guarantee: "eos.Processor: outputs and offsets in one transaction",
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			return l.kafkaPipeline(ctx, p, eos.ExactlyOnce, resume)
		},
	}
}

// control is a weaker design the pattern is measured against: the program
// kafkatokafka.Run runs, with semantics that commit the offsets apart from
// the outputs (and so without a transactional id).
func control(sem eos.Semantics) func(context.Context, kafkatokafka.Config) error {
	return func(ctx context.Context, cfg kafkatokafka.Config) error {
		opts := append([]eos.ProcessorOption{
			eos.Brokers(cfg.Brokers...), eos.Group(cfg.Group), eos.Topics(cfg.Input),
			eos.WithSemantics(sem), eos.Logger(cfg.Logger),
		}, cfg.Options...)
		proc, err := eos.NewProcessor(cfg.Handler, opts...)
		if err != nil {
			return err
		}
		return proc.Run(ctx)
	}
}

// kafkaPipeline runs the source into an input topic, then the pattern
// kafkatokafka (or, for the weaker semantics, its control) forwarding
// reports to an output topic through the lab's faults, and reads the output
// back as a read_committed reader would.
func (l *Lab) kafkaPipeline(ctx context.Context, p Pattern, sem eos.Semantics, policy sourcePolicy) (result, error) {
	adm, closeAdm, err := l.admin()
	if err != nil {
		return result{}, err
	}
	defer closeAdm()
	name := runName(p)
	in, out := name+"-in", name+"-out"
	if err := l.newTopics(ctx, adm, in, out); err != nil {
		return result{}, err
	}
	defer func() { _, _ = adm.DeleteTopics(context.WithoutCancel(ctx), in, out) }()

	srcSem := sem
	if policy == resume {
		srcSem = eos.ExactlyOnce // idempotent, without a transactional id
	}
	feed := func(ctx context.Context, from, to int) error {
		l.progress(p, fmt.Sprintf("source: writing reports %d to %d", from, to))
		return source(ctx, l.Brokers, in, l.Reports[from:to], from, l.LostEvery, policy, srcSem, false)
	}

	run := kafkatokafka.Run
	if sem != eos.ExactlyOnce {
		run = control(sem)
	}
	forward := kafkatokafka.Forward(out)
	start := func(ctx context.Context, instance string, clientOpts []kgo.Opt, wait func()) error {
		err := run(ctx, kafkatokafka.Config{
			Brokers: l.Brokers, Group: name, Instance: instance, Input: in, Output: out,
			Handler: func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
				wait()
				return forward(ctx, r)
			},
			Logger: l.Logger.With("pattern", p.Name, "instance", instance),
			Options: []eos.ProcessorOption{
				eos.CommitInterval(200 * time.Millisecond), eos.ClientOptions(clientOpts...),
				// The lab stops an instance abruptly by ending its ctx:
				// no drain, so that the stop acts as a crash does.
				eos.DrainTimeout(0),
			},
		})
		if errors.Is(err, eos.ErrFenced) {
			return nil // the zombie, stopped as it must be
		}
		return err
	}
	faults, err := l.churn(ctx, p, start, feed, groupProgress(adm, name, in), describeGroup(adm, name))
	if err != nil {
		return result{}, err
	}
	return l.readKafkaOutput(ctx, out, faults)
}

// readKafkaOutput reads the output topic as a read_committed reader, and its
// raw log for the records of aborted transactions.
func (l *Lab) readKafkaOutput(ctx context.Context, topic string, faults []string) (result, error) {
	committed, err := verify.ReadTopic(ctx, l.Brokers, topic, kgo.ReadCommitted(), true, time.Minute)
	if err != nil {
		return result{}, err
	}
	res := result{faults: faults, totals: map[string]int{}}
	for _, r := range committed {
		rep, err := dashboard.Parse(r.Value)
		if err != nil {
			return result{}, err
		}
		res.outputs = append(res.outputs, outputOf(rep, verify.Position{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}))
		res.totals[rep.Region] += rep.Cases
	}
	raw, err := verify.ReadRawTopic(ctx, l.Brokers, topic, time.Minute)
	if err != nil {
		return result{}, err
	}
	res.aborted = verify.AbortedPositions(raw)
	return res, nil
}

// producerResume is the pattern producerresume alone: one producer per
// partition, which after an unknown outcome reads the last record of its
// partition to decide whether to resend, and which after a crash resumes
// after the last record it finds.
func producerResume() Pattern {
	return Pattern{
		Name:      "exactly-once producer resume",
		Guarantee: "one producer per partition; reads its last record to resend or go on",
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			adm, closeAdm, err := l.admin()
			if err != nil {
				return result{}, err
			}
			defer closeAdm()
			topic := runName(p)
			if err := l.newTopics(ctx, adm, topic); err != nil {
				return result{}, err
			}
			defer func() { _, _ = adm.DeleteTopics(context.WithoutCancel(ctx), topic) }()

			// The first producer writes 60% and crashes with its last
			// send's outcome unknown (it was written).
			cut := len(l.Reports) * 3 / 5
			l.progress(p, "source: writing until a crash at 60%")
			if err := source(ctx, l.Brokers, topic, l.Reports[:cut], 0, l.LostEvery, resume, eos.ExactlyOnce, false); err != nil {
				return result{}, err
			}
			// The restarted producer learns from each partition's last
			// record where it stopped, and goes on after it.
			l.progress(p, "source: restarted; resuming after each partition's last record")
			rest, err := resumePoint(ctx, l.Brokers, topic, l.Reports)
			if err != nil {
				return result{}, err
			}
			if err := source(ctx, l.Brokers, topic, rest, len(l.Reports)-len(rest), l.LostEvery, resume, eos.ExactlyOnce, false); err != nil {
				return result{}, err
			}
			return l.readKafkaOutput(ctx, topic, []string{"unknown outcome at the source", "producer crash and restart"})
		},
	}
}

// resumePoint returns the reports not yet in topic: per partition, those
// after the partition's last record, as each region's restarted
// producerresume.Producer finds it.
func resumePoint(ctx context.Context, brokers []string, topic string, reports []dashboard.Report) ([]dashboard.Report, error) {
	lastIndex := map[string]int{}
	for _, region := range regions {
		p, err := producerresume.New(producerresume.Config{Brokers: brokers, Topic: topic, Partition: regionPartition(region)})
		if err != nil {
			return nil, err
		}
		id, err := p.Last(ctx)
		p.Close()
		if err != nil {
			return nil, err
		}
		lastIndex[region] = -1
		for i, r := range reports {
			if r.ID == id {
				lastIndex[region] = i
			}
		}
	}
	var rest []dashboard.Report
	for i, r := range reports {
		if i > lastIndex[r.Region] {
			rest = append(rest, r)
		}
	}
	if len(rest) == len(reports) {
		return nil, fmt.Errorf("resume: found nothing written before the crash")
	}
	return rest, nil
}
