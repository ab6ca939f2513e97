package eoslab

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/kafkatokafka"
	"github.com/eoskit/eoskit/patterns/producerresume"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/verify"
	"github.com/eoskit/eoskit/window"
)

// The Kafka rows: three weaker designs (controls), at-most-once,
// at-least-once, and exactly-once outputs with the totals in a Go map, and
// the exactly-once pattern kafkatokafka with its totals in Kafka, each
// consuming the same source through the same faults; and the resume
// producer alone.

func atMostOnce() Pattern {
	return Pattern{
		Name:      "at-most-once",
		Guarantee: "never retries; loses what was in flight",
		Control:   true,
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			return l.kafkaPipeline(ctx, p, eos.AtMostOnce, giveUp, totalsOfFeed)
		},
	}
}

func atLeastOnce() Pattern {
	return Pattern{
		Name:      "at-least-once",
		Guarantee: "no loss; duplicates what was in flight",
		Control:   true,
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			return l.kafkaPipeline(ctx, p, eos.AtLeastOnce, resend, totalsOfFeed)
		},
	}
}

// mapTotalsKafka is the control for the totals: the pattern kafkatokafka,
// its outputs exactly once, but with the totals, and the counts per day,
// kept the way a first attempt keeps them, in Go maps the handler
// updates, outside the transaction, each new total published as an
// output. Its days are also wrong without faults: a map has no grace, and
// counts the late reports in days long closed.
func mapTotalsKafka() Pattern {
	return Pattern{
		Name:      "kafka→kafka, totals in a map",
		Guarantee: "outputs in the transaction; totals and days in Go maps outside it",
		Control:   true,
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			return l.kafkaPipeline(ctx, p, eos.ExactlyOnce, resume, totalsInMap)
		},
	}
}

func exactlyOnceKafka() Pattern {
	return Pattern{
		Name:      "exactly-once kafka→kafka",
		Guarantee: "eos.Processor: outputs, offsets and the totals' and days' state in one transaction",
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			return l.kafkaPipeline(ctx, p, eos.ExactlyOnce, resume, totalsInState)
		},
	}
}

// totalsKept is where a Kafka row keeps the dashboard's totals.
type totalsKept int8

const (
	// totalsOfFeed: the dashboard sums the reports of the feed (the
	// controls with weaker semantics, whose feed shows their losses and
	// duplicates).
	totalsOfFeed totalsKept = iota
	// totalsInState: the processor sums the cases per region in its keyed
	// state, whose changelog commits in its transaction, and emits each
	// changed total (kafkatokafka's Config.Totals); the dashboard reads
	// each region's last total. A second processor sums them per region
	// per day (Config.Daily, Config.DailyFinal), and the dashboard reads
	// each day's last count and its final.
	totalsInState
	// totalsInMap: the handler sums them, and per day, in Go maps,
	// outside the transaction, and emits each new total and day's count;
	// the dashboard reads each region's last total and day's count.
	totalsInMap
)

// The processors of an instance of the exactly-once kafka→kafka row, as
// the faults' evidence names them.
const (
	totalsProcessor = "totals processor"
	dailyProcessor  = "daily counts processor"
)

// control is a weaker design the pattern is measured against: the program
// kafkatokafka.Run runs (its Handler, under its Wrap), with semantics that
// commit the offsets apart from the outputs (and so without a
// transactional id).
func control(sem eos.Semantics) func(context.Context, kafkatokafka.Config) error {
	return func(ctx context.Context, cfg kafkatokafka.Config) error {
		opts := append([]eos.ProcessorOption{
			eos.Brokers(cfg.Brokers...), eos.Group(cfg.Group), eos.Topics(cfg.Input),
			eos.WithSemantics(sem), eos.Logger(cfg.Logger),
		}, cfg.Options...)
		h := cfg.Handler
		if cfg.Wrap != nil {
			h = cfg.Wrap(cfg.Group, h)
		}
		proc, err := eos.NewProcessor(h, opts...)
		if err != nil {
			return err
		}
		return proc.Run(ctx)
	}
}

// kafkaPipeline runs the source into an input topic, then the pattern
// kafkatokafka (or, for the weaker semantics, its control) forwarding
// reports to an output topic through the lab's faults, keeping the totals
// as kept says, and reads the output (and the totals topic) back as a
// read_committed reader would.
func (l *Lab) kafkaPipeline(ctx context.Context, p Pattern, sem eos.Semantics, policy sourcePolicy, kept totalsKept) (result, error) {
	adm, closeAdm, err := l.admin()
	if err != nil {
		return result{}, err
	}
	defer closeAdm()
	name := runName(p)
	in, out := name+"-in", name+"-out"
	var totalsTopic, changelog, days, daysFinal, daysChangelog string
	topics := []string{in, out}
	if kept != totalsOfFeed {
		totalsTopic, days = name+"-totals", name+"-days"
		topics = append(topics, totalsTopic, days)
	}
	if kept == totalsInState {
		daysFinal = name + "-days-final"
		topics = append(topics, daysFinal)
	}
	if err := l.newTopics(ctx, adm, topics...); err != nil {
		return result{}, err
	}
	if kept == totalsInState {
		changelog, daysChangelog = name+"-changelog", name+"-days-changelog"
		if err := l.newTopicsWith(ctx, adm, map[string]string{"cleanup.policy": "compact"}, changelog, daysChangelog); err != nil {
			return result{}, err
		}
		topics = append(topics, changelog, daysChangelog)
	}
	defer func() { _, _ = adm.DeleteTopics(context.WithoutCancel(ctx), topics...) }()

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
	start := func(ctx context.Context, instance string, clientOpts []kgo.Opt, wait func(processor string)) error {
		// Each instance is a process of its own: a map of totals starts
		// empty in it.
		forward := kafkatokafka.Forward(out)
		if kept == totalsInMap {
			forward = mapTotals(forward, totalsTopic, days)
		}
		cfg := kafkatokafka.Config{
			Brokers: l.Brokers, Group: name, Instance: instance, Input: in, Output: out, Handler: forward,
			// The lab's faults catch a handler of either processor (the
			// daily one's too) mid-transaction, and say which.
			Wrap: func(group string, h eos.HandlerFunc) eos.HandlerFunc {
				processor := ""
				if kept == totalsInState {
					processor = totalsProcessor
					if group != name {
						processor = dailyProcessor
					}
				}
				return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
					wait(processor)
					return h(ctx, r)
				}
			},
			Logger: l.Logger.With("pattern", p.Name, "instance", instance),
			Options: []eos.ProcessorOption{
				eos.CommitInterval(200 * time.Millisecond), eos.ClientOptions(clientOpts...),
				// The lab stops an instance abruptly by ending its ctx:
				// no drain, so that the stop acts as a crash does.
				eos.DrainTimeout(0),
			},
		}
		if kept == totalsInState {
			cfg.Totals, cfg.Changelog = totalsTopic, changelog
			cfg.Daily, cfg.DailyFinal, cfg.DailyChangelog = days, daysFinal, daysChangelog
		}
		return onlyFenced(run(ctx, cfg))
	}
	progress := groupProgress(adm, name, in)
	if kept == totalsInState { // the instances also run the daily group: wait for both
		progress = slowest(progress, groupProgress(adm, name+"-daily", in))
	}
	var processors []string
	if kept == totalsInState {
		// The rebalance and the zombie catch the totals processor,
		// whose group the lab watches; the crash the daily counts'.
		processors = []string{totalsProcessor, dailyProcessor}
	}
	faults, err := l.churn(ctx, p, start, feed, progress, describeGroup(adm, name, in), groupOffsets(adm, name, in), processors...)
	if err != nil {
		return result{}, err
	}
	res, err := l.readKafkaOutput(ctx, out, faults)
	if err != nil || totalsTopic == "" {
		return res, err
	}
	if res.totals, err = l.readTotals(ctx, totalsTopic); err != nil {
		return res, err
	}
	res.days, err = l.checkDays(ctx, in, days, daysFinal)
	return res, err
}

// onlyFenced is nil for an instance's error that is ErrFenced alone (the
// zombie, stopped as it must be: each of its processors fenced, or ended
// by the other's fence), else err.
func onlyFenced(err error) error {
	var te *eos.TogetherError
	if errors.As(err, &te) {
		for _, e := range te.Errs {
			if e != nil && !errors.Is(e, eos.ErrFenced) {
				return err
			}
		}
		return nil
	}
	if errors.Is(err, eos.ErrFenced) {
		return nil
	}
	return err
}

// slowest is the progress of two groups reading the same topic: the
// smaller of their committed offsets.
func slowest(a, b func(context.Context) (int64, int64, error)) func(context.Context) (int64, int64, error) {
	return func(ctx context.Context) (int64, int64, error) {
		doneA, total, err := a(ctx)
		if err != nil {
			return 0, 0, err
		}
		doneB, _, err := b(ctx)
		if err != nil {
			return 0, 0, err
		}
		return min(doneA, doneB), total, nil
	}
}

// mapTotals is the totals' control: h, whose outputs are followed by the
// report's region's new total and its day's new count, kept in maps of
// the process, outside the transaction. A batch that aborts and is
// handled again adds its reports twice; an instance that restarts, or is
// given a partition, starts that region from nothing; and a report is
// added to its day however late it comes.
func mapTotals(h eos.HandlerFunc, topic, daysTopic string) eos.HandlerFunc {
	var mu sync.Mutex
	sums, days := map[string]int64{}, map[string]int64{}
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		out, err := h(ctx, r)
		if err != nil {
			return nil, err
		}
		rep, err := dashboard.Parse(r.Value)
		if err != nil {
			return nil, err
		}
		at, err := dashboard.ReportedAt(r)
		if err != nil {
			return nil, err
		}
		day := window.AppendKey(nil, []byte(rep.Region), at.Truncate(24*time.Hour))
		mu.Lock()
		sums[rep.Region] += int64(rep.Cases)
		days[string(day)] += int64(rep.Cases)
		total, inDay := sums[rep.Region], days[string(day)]
		mu.Unlock()
		return append(out, &kgo.Record{Topic: topic, Key: []byte(rep.Region), Value: state.AppendInt64(nil, total)},
			&kgo.Record{Topic: daysTopic, Key: day, Value: state.AppendInt64(nil, inDay)}), nil
	}
}

// readTotals reads a totals topic as the dashboard does, read_committed,
// and returns each region's last total.
func (l *Lab) readTotals(ctx context.Context, topic string) (map[string]int, error) {
	last, err := l.lastValues(ctx, topic)
	if err != nil {
		return nil, err
	}
	totals := make(map[string]int, len(last))
	for k, n := range last {
		totals[k] = int(n)
	}
	return totals, nil
}

// lastValues reads topic read_committed and returns each key's last value,
// a number as decimal text (a key whose last record is a tombstone left
// out).
func (l *Lab) lastValues(ctx context.Context, topic string) (map[string]int64, error) {
	recs, err := verify.ReadTopic(ctx, l.Brokers, topic, kgo.ReadCommitted(), true, time.Minute)
	if err != nil {
		return nil, err
	}
	last := map[string]int64{}
	for _, r := range recs {
		if r.Value == nil {
			delete(last, string(r.Key))
			continue
		}
		n, err := state.Int64(r.Value)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]@%d: value of %q: %w", topic, r.Partition, r.Offset, r.Key, err)
		}
		last[string(r.Key)] = n
	}
	return last, nil
}

// daysResult is what the lab found of a row's counts per region per day.
type daysResult struct {
	checked bool
	// wrong counts the days whose last count is not the truth's, the
	// closed days without exactly one final equal to it, and the finals
	// of days not closed.
	wrong int
	// days is how many days the truth has, late how many reports came
	// after their day closed, finals how many finals the row published.
	days, late, finals int
}

// checkDays checks a row's counts per region per day against the truth
// its committed input gives (verify.SumWindows over dashboard.Days by
// each report's time, rules written apart from eos's): each day's last
// count on the topic days, and, with a finals topic, each closed day's
// final, once and equal to its count, and no other.
func (l *Lab) checkDays(ctx context.Context, in, days, finals string) (daysResult, error) {
	input, err := verify.ReadTopic(ctx, l.Brokers, in, kgo.ReadCommitted(), true, time.Minute)
	if err != nil {
		return daysResult{}, err
	}
	truth := verify.SumWindows(input, dashboard.Days.Size, dashboard.Days.Grace, dashboard.Days.Retention, func(r *kgo.Record) (time.Time, int64, bool) {
		rep, err := dashboard.Parse(r.Value)
		at := rep.ReportedAt
		if at.IsZero() {
			at = r.Timestamp
		}
		return at, int64(rep.Cases), err == nil && at.After(time.Unix(0, 0)) && !at.After(r.Timestamp.Add(dashboard.MaxAhead))
	})
	res := daysResult{checked: true, days: len(truth.Counts), late: truth.Late}
	live, err := l.lastValues(ctx, days)
	if err != nil {
		return daysResult{}, err
	}
	// A day past retention is deleted: the live topic ends with its
	// tombstone.
	for key, n := range truth.Counts {
		if got, ok := live[key]; truth.Expired[key] && ok || !truth.Expired[key] && got != n {
			res.wrong++
		}
	}
	for key := range live {
		if _, ok := truth.Counts[key]; !ok {
			res.wrong++
		}
	}
	if finals == "" {
		return res, nil
	}
	recs, err := verify.ReadTopic(ctx, l.Brokers, finals, kgo.ReadCommitted(), true, time.Minute)
	if err != nil {
		return daysResult{}, err
	}
	res.finals = len(recs)
	seen := map[string]int{}
	for _, r := range recs {
		n, err := state.Int64(r.Value)
		want, closed := truth.Closed[string(r.Key)]
		if seen[string(r.Key)]++; err != nil || !closed || n != want || seen[string(r.Key)] > 1 {
			res.wrong++
		}
	}
	for key := range truth.Closed {
		if seen[key] == 0 {
			res.wrong++
		}
	}
	return res, nil
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
