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
// With Config.Totals it also keeps the dashboard's per-region totals in
// Kafka: each report's cases added to its region's sum in the processor's
// keyed state, whose changelog commits in the same transaction, and each
// total a transaction changed published once to the totals topic, keyed by
// region, as decimal text. A read_committed reader's last value per region
// is then the exact total, through the same faults: a transaction that
// aborts leaves neither its outputs nor its additions, and a partition's
// new owner restores the totals from the changelog before it counts. The
// totals alone are three lines of eos (Count for a number of records):
//
//	p, err := eos.NewProcessor(eos.Sum(dashboard.Cases),
//		eos.Brokers(b), eos.Group("dashboard"), eos.Topics("case-reports"), eos.TransactionalID(id),
//		eos.Changelog("dashboard-totals-changelog", eos.EmitUpdates("dashboard-totals")))
//
// With Config.Daily or Config.DailyFinal it also counts the cases per
// region per day, by when each case was reported (dashboard.ReportedAt),
// in a second processor beside the first ([NewDaily]): a day's count takes
// reports up to an hour after the day ends, a later report is late and
// changes no day (counted in eos.LateMetrics), and a day's final count is
// published once when it closes, in the transaction that closed it. The
// counts alone are eos's:
//
//	sum, err := eos.WindowedSum(dashboard.Days, dashboard.Cases,
//		eos.EventTime(dashboard.ReportedAt), eos.EmitFinal("dashboard-days-final"))
//
// With Config.RegionNames each report on the feed carries its region's
// name (header "region-name"), looked up in a small compacted topic held
// whole on every instance (eos.GlobalTable): as current as its last
// refresh, a second or so, not as of the report's time.
//
// Totals kept anywhere else (a map in the handler, a counter in a cache)
// are updated outside the transaction: an aborted batch, handled again,
// adds twice, and a restarted instance starts from nothing. cmd/eoslab
// runs that design beside this one through the same faults.
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

	"github.com/eoskit/eoskit"
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
	// the transactional id that fences a stalled predecessor. New does
	// not make it the group's static membership; the program does, with
	// eos.InstanceID in Options.
	Instance string
	// Input is the topic of incoming reports; Output the dashboard's feed.
	Input, Output string
	// Totals, when set, is the topic of the per-region totals (see the
	// package doc): Run adds [WithTotals] around the handler and gives
	// the processor eos.Changelog(Changelog, eos.EmitUpdates(Totals)).
	// Default "": no totals.
	Totals string
	// Changelog is where the totals' state is logged, in the
	// transaction: a topic with cleanup.policy=compact and the input's
	// partition count (Run refuses another, or a missing one, with a
	// *eoskit.ConfigError). Required with Totals.
	Changelog string
	// Daily, when set, is the topic of the live counts of cases per
	// region per day (dashboard.Days by dashboard.ReportedAt): in each
	// transaction, each day's count it changed, keyed by
	// window.AppendKey(region, the day's start), as decimal text; a
	// tombstone for a day past retention. Default "": none.
	Daily string
	// DailyFinal, when set, is the topic each day's final count is
	// published to, once, when the day closes (stream time an hour past
	// its end): never before, never twice. Keyed as Daily's. Default "":
	// none.
	DailyFinal string
	// DailyChangelog is where the counts per day are logged: as
	// Changelog, a topic of its own. Required with Daily or DailyFinal,
	// which make Run run a second processor ([NewDaily]) beside the
	// first, in group Group+"-daily".
	DailyChangelog string
	// RegionNames, when set, is a small compacted topic of region names
	// keyed by region code, held whole on every instance (an
	// eos.GlobalTable, restored before the first report): each report on
	// the feed carries its region's name in the header "region-name"
	// ([WithNames]). A region the table does not name gets no header.
	// Default "": none.
	RegionNames string
	// DeadLetterTopic, when set, takes a report the handler cannot use
	// (one that does not parse, say), written in the batch's transaction
	// with headers that say why (eos.DeadLetter), and the processor goes
	// on; `eoskit dead-letters` lists and replays it. The topic must
	// exist. Default "": such a report stops Run with a
	// *eoskit.RecordError naming it, and a restart meets it again.
	DeadLetterTopic string
	// Handler turns one input record into its outputs. Default:
	// Forward(Output).
	Handler eos.HandlerFunc
	// Wrap, when set, wraps the whole handler of each processor Run
	// runs (New's, after WithNames and WithTotals, and NewDaily's): a
	// tracer, a timer, a test's fault. group is the processor's consumer
	// group (Group, or Group+"-daily"), to tell them apart. Default nil:
	// none.
	Wrap func(group string, h eos.HandlerFunc) eos.HandlerFunc
	// Logger receives the processor's logs. Default: slog.Default().
	Logger *slog.Logger
	// Options are further processor options (eos.CommitInterval,
	// eos.DrainTimeout, eos.ClientOptions...), applied after the
	// pattern's own.
	Options []eos.ProcessorOption
}

// wrapped is h, the handler of group's processor, under c.Wrap, if any.
func (c Config) wrapped(group string, h eos.HandlerFunc) eos.HandlerFunc {
	if c.Wrap == nil {
		return h
	}
	return c.Wrap(group, h)
}

// Forward is the pattern's handler: it checks each input is a report, with
// a time the counts per day can take (dashboard.ReportedAt), and publishes
// it to topic, keyed by its region. A record that is not one is an error,
// which stops the processor (Config.DeadLetterTopic parks it instead).
func Forward(topic string) eos.HandlerFunc {
	return func(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		rep, err := dashboard.Parse(in.Value)
		if err != nil {
			return nil, err
		}
		if _, err := dashboard.ReportedAt(in); err != nil {
			return nil, err
		}
		return []*kgo.Record{rep.Record(topic)}, nil
	}
}

// WithTotals returns h that also adds each report's cases to its region's
// total in the processor's keyed state (eos.Sum(dashboard.Cases)); the
// record's outputs are h's. A record that is not a report, or whose
// region's total would overflow, is the record's error, as in h.
func WithTotals(h eos.HandlerFunc) eos.HandlerFunc {
	sum := eos.Sum(dashboard.Cases)
	return func(ctx context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		out, err := h(ctx, in)
		if err != nil {
			return nil, err
		}
		if _, err := sum(ctx, in); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// RegionNameHeader is the header [WithNames] names a report's region in.
const RegionNameHeader = "region-name"

// WithNames returns h whose outputs each carry their key's name from
// names (region code to name), in the header RegionNameHeader; a key the
// table does not hold gets none. A table not restored yet, or that
// cannot be read, is an error (the processor restores its tables before
// the first record, so this is a table given to no processor).
func WithNames(h eos.HandlerFunc, names *eos.GlobalTable) eos.HandlerFunc {
	return func(ctx context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		out, err := h(ctx, in)
		if err != nil {
			return nil, err
		}
		for _, r := range out {
			name, ok, err := names.Get(r.Key)
			if err != nil {
				return nil, err
			}
			if ok {
				r.Headers = append(r.Headers, kgo.RecordHeader{Key: RegionNameHeader, Value: name})
			}
		}
		return out, nil
	}
}

// New returns the processor cfg describes: Run it, and serve its Health
// to probes (package probe).
func New(cfg Config) (*eos.Processor, error) {
	txnID, err := eos.StableTransactionalID(cfg.Group, cfg.Instance)
	if err != nil {
		return nil, fmt.Errorf("kafkatokafka: %w", err)
	}
	handler, logger := cfg.Handler, cfg.Logger
	if handler == nil {
		handler = Forward(cfg.Output)
	}
	if logger == nil {
		logger = slog.Default()
	}
	opts := []eos.ProcessorOption{
		eos.Brokers(cfg.Brokers...),
		eos.Group(cfg.Group),
		eos.Topics(cfg.Input),
		eos.WithSemantics(eos.ExactlyOnce), // the default, said aloud
		eos.TransactionalID(txnID),
		eos.Logger(logger),
	}
	if cfg.RegionNames != "" {
		names := eos.NewGlobalTable(cfg.RegionNames)
		handler = WithNames(handler, names)
		opts = append(opts, eos.WithGlobalTables(names))
	}
	if cfg.Totals != "" {
		handler = WithTotals(handler)
		opts = append(opts, eos.Changelog(cfg.Changelog, eos.EmitUpdates(cfg.Totals)))
	}
	if cfg.DeadLetterTopic != "" {
		opts = append(opts, eos.OnHandlerError(eos.DeadLetter(cfg.DeadLetterTopic)))
	}
	return eos.NewProcessor(cfg.wrapped(cfg.Group, handler), append(opts, cfg.Options...)...)
}

// NewDaily returns the processor of the counts per region per day that
// cfg describes (Daily, DailyFinal, DailyChangelog): eos.WindowedSum of
// the reports' cases over dashboard.Days by dashboard.ReportedAt, in group
// Group+"-daily" with its own transactional id, reading Input. A record
// that is not a report with a usable time is skipped here, counted in no
// day: New's processor is the one that parks it (DeadLetterTopic) or
// stops on it, so that it is dead-lettered once, and a replay of it
// reaches both. Run runs it beside New's.
func NewDaily(cfg Config) (*eos.Processor, error) {
	if cfg.Daily == "" && cfg.DailyFinal == "" {
		return nil, &eoskit.ConfigError{Package: "kafkatokafka", Setting: "Daily", Reason: "neither Daily nor DailyFinal is set"}
	}
	group := cfg.Group + "-daily"
	txnID, err := eos.StableTransactionalID(group, cfg.Instance)
	if err != nil {
		return nil, fmt.Errorf("kafkatokafka: %w", err)
	}
	wopts := []eos.WindowOption{eos.EventTime(dashboard.ReportedAt)}
	if cfg.DailyFinal != "" {
		wopts = append(wopts, eos.EmitFinal(cfg.DailyFinal))
	}
	sum, err := eos.WindowedSum(dashboard.Days, dashboard.Cases, wopts...)
	if err != nil {
		return nil, err
	}
	daily := cfg.wrapped(cfg.Group+"-daily", func(ctx context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		if _, err := dashboard.ReportedAt(in); err != nil {
			return nil, nil // New's processor parks it, or stops on it
		}
		return sum(ctx, in)
	})
	var sopts []eos.StateOption
	if cfg.Daily != "" {
		sopts = append(sopts, eos.EmitUpdates(cfg.Daily))
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	opts := []eos.ProcessorOption{
		eos.Brokers(cfg.Brokers...),
		eos.Group(group),
		eos.Topics(cfg.Input),
		eos.WithSemantics(eos.ExactlyOnce),
		eos.TransactionalID(txnID),
		eos.Logger(logger.With("processor", "daily")),
		eos.Changelog(cfg.DailyChangelog, sopts...),
	}
	if cfg.DeadLetterTopic != "" {
		opts = append(opts, eos.OnHandlerError(eos.DeadLetter(cfg.DeadLetterTopic)))
	}
	return eos.NewProcessor(daily, append(opts, cfg.Options...)...)
}

// Run runs the processor until ctx ends, then drains: it lets the batch in
// hand finish and commits it (eos.DrainTimeout bounds that), and returns
// nil. It returns eos.ErrFenced when a newer instance with the same Group
// and Instance took over. With Daily or DailyFinal it runs NewDaily's
// processor beside it: the first of the two to end ends the other, and
// Run returns an *eos.TogetherError with both's errors (eos.RunTogether).
func Run(ctx context.Context, cfg Config) error {
	proc, err := New(cfg)
	if err != nil {
		return err
	}
	if cfg.Daily == "" && cfg.DailyFinal == "" {
		return proc.Run(ctx)
	}
	daily, err := NewDaily(cfg)
	if err != nil {
		return err
	}
	return eos.RunTogether(ctx, proc, daily)
}
