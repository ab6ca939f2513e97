package eoslab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/topics"
	"github.com/eoskit/eoskit/verify"
)

// ErrStalled is wrapped by the *StepError that [Lab.Run] returns when a
// step of a pattern's run did not finish within [Lab.StepTimeout]: the run
// is abandoned rather than left hanging.
var ErrStalled = errors.New("eoslab: run stalled")

// StepError says where a run stalled: the pattern, the step it was waiting
// in, for how long, and the progress it had seen (records whose offsets
// were committed, of those written so far).
type StepError struct {
	Pattern string
	Step    string
	Waited  time.Duration
	Done    int64
	Total   int64
	// Err is ErrStalled, or what ended the wait early (an instance that
	// failed, the context).
	Err error
	// State says where the group stood at a stall (ErrStalled): its
	// members and their partitions, and each partition's committed
	// offset against its end.
	State string
}

func (e *StepError) Error() string {
	msg := fmt.Sprintf("pattern %s: step %q ended after %s at %d of %d records committed: %v",
		e.Pattern, e.Step, e.Waited.Round(time.Millisecond), e.Done, e.Total, e.Err)
	if e.State != "" {
		msg += " (" + e.State + ")"
	}
	return msg
}

func (e *StepError) Unwrap() error { return e.Err }

// Lab runs the rows on one workload with the same injected faults.
type Lab struct {
	// Brokers are the bootstrap addresses of the cluster to run on.
	Brokers []string
	// Pool is the PostgreSQL for the database patterns; nil skips them.
	Pool *pgxpool.Pool
	// Reports is the workload; default Workload(4000).
	Reports []dashboard.Report
	// LostEvery makes the source's outcome unknown every LostEvery
	// reports (half written with the acknowledgement lost, half never
	// written). Default 200.
	LostEvery int
	// Progress, when set, is told what each pattern is doing.
	Progress func(pattern, step string)
	// Logger receives the components' logs. Default: discard.
	Logger *slog.Logger

	// SessionTimeout is the group session timeout of the consumers, and
	// the zombie stalls for longer than it. Default 3s.
	SessionTimeout time.Duration
	// RecordDelay is how long each handler call works. Default 500µs.
	RecordDelay time.Duration
	// StepTimeout bounds every wait of a run (for progress, for a handler
	// to reach a fault, for a rebalance, for an instance to stop); a step
	// that takes longer fails the pattern with a *StepError. Default: 30 s,
	// plus four session timeouts, plus 2 ms per report.
	StepTimeout time.Duration
}

func (l *Lab) defaults() {
	if l.Reports == nil {
		l.Reports = Workload(4000)
	}
	if l.LostEvery == 0 {
		l.LostEvery = 200
	}
	if l.Logger == nil {
		l.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if l.SessionTimeout == 0 {
		l.SessionTimeout = 3 * time.Second
	}
	if l.RecordDelay == 0 {
		l.RecordDelay = 500 * time.Microsecond
	}
	if l.StepTimeout == 0 {
		l.StepTimeout = 30*time.Second + 4*l.SessionTimeout + time.Duration(len(l.Reports))*2*time.Millisecond
	}
}

func (l *Lab) progress(p Pattern, step string) {
	if l.Progress != nil {
		l.Progress(p.Name, step)
	}
}

// heartbeat is the consumers' heartbeat interval.
func (l *Lab) heartbeat() time.Duration { return l.SessionTimeout / 4 }

func (l *Lab) clientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(l.SessionTimeout),
		// The 3 s default heartbeat would let a 3 s session expire.
		kgo.HeartbeatInterval(l.heartbeat()),
		kgo.RebalanceTimeout(l.SessionTimeout),
		kgo.TransactionTimeout(max(4*l.SessionTimeout, 10*time.Second)),
	}
}

// UnknownOutcomes returns how many reports of the workload the source
// writes with the acknowledgement lost, and how many it never writes (see
// LostEvery): what the source alone makes a resending producer duplicate,
// and a producer that gives up lose. A consumer-side fault must show on
// top of these.
func (l *Lab) UnknownOutcomes() (ackLost, neverWritten int) {
	l.defaults()
	for i := range l.Reports {
		switch faultFor(i, l.LostEvery) {
		case writtenAckLost:
			ackLost++
		case notWritten:
			neverWritten++
		}
	}
	return ackLost, neverWritten
}

// Outcome is what the verifier found for one pattern.
type Outcome struct {
	Pattern   string `json:"pattern"`
	Guarantee string `json:"guarantee"`
	// Skipped says why the pattern did not run, or did not finish ("" if
	// it ran).
	Skipped string `json:"skipped,omitempty"`
	// Failed is set (by the caller of Run) when the run ended with an
	// error: a stalled step, an instance that failed.
	Failed bool `json:"failed,omitempty"`
	// Faults lists the faults injected, each with what showed it took
	// hold (the instance caught mid-batch, the group's state).
	Faults         []string       `json:"faults,omitempty"`
	Input          int            `json:"input"`
	Output         int            `json:"output"`
	Lost           int            `json:"lost"`
	Duplicated     int            `json:"duplicated"`
	AbortedVisible int            `json:"aborted_visible"`
	OutOfOrder     int            `json:"out_of_order"`
	Totals         map[string]int `json:"totals,omitempty"`
	TotalsCorrect  bool           `json:"totals_correct"`
	// Control marks a weaker design, run to show what it breaks.
	Control bool `json:"control,omitempty"`
	// TotalsVerdict is what the table prints for the totals: "yes"
	// (correct), "no", or, for a control whose totals came out right in
	// this run, "not shown": the faults did not break it this time, which
	// proves nothing about the design.
	TotalsVerdict string `json:"totals_verdict"`
	// DaysVerdict is the same for the counts per region per day, of the
	// rows that keep them ("" for the others): "yes" when each day's
	// last count, and each closed day's one final, equal the truth
	// computed from the committed input.
	DaysVerdict string `json:"days_verdict,omitempty"`
	// DaysWrong counts the days (and finals) that did not; Days and
	// LateReports are the truth's days and late reports.
	DaysWrong   int           `json:"days_wrong,omitempty"`
	Days        int           `json:"days,omitempty"`
	LateReports int           `json:"late_reports,omitempty"`
	Finals      int           `json:"finals,omitempty"`
	Report      verify.Report `json:"-"`
	Duration    time.Duration `json:"duration_ns"`
}

// Pattern is one row of the lab's table: a reference pattern, or a weaker
// design (a control) it is measured against, and how the lab runs it.
type Pattern struct {
	// Name is the pattern's short name, as the table prints it.
	Name string
	// Guarantee is what it promises.
	Guarantee string
	// NeedsDatabase marks the patterns whose results live in PostgreSQL.
	NeedsDatabase bool
	// Control marks a weaker design, run to show what it breaks: its
	// totals are reported "not shown", never correct, when a run's
	// faults happen not to break them.
	Control bool
	run     func(ctx context.Context, l *Lab, p Pattern) (result, error)
}

// result is what a pattern run leaves for the verifier.
type result struct {
	faults  []string
	outputs []verify.Output
	aborted map[verify.Position]bool
	totals  map[string]int
	days    daysResult
}

// All returns the patterns in the order the table lists them.
func All() []Pattern {
	return []Pattern{
		atMostOnce(), atLeastOnce(), mapTotalsKafka(), exactlyOnceKafka(), exactlyOncePostgres(), dedupPostgres(), producerResume(),
		atLeastOnceOutbox(), exactlyOnceOutbox(),
	}
}

// Run runs p and verifies what it produced against the workload.
func (l *Lab) Run(ctx context.Context, p Pattern) (Outcome, error) {
	l.defaults()
	out := Outcome{Pattern: p.Name, Guarantee: p.Guarantee, Control: p.Control, Input: len(l.Reports)}
	if p.NeedsDatabase && l.Pool == nil {
		out.Skipped = "skipped: needs PostgreSQL (give --database-url, or run make demo)"
		return out, nil
	}
	start := time.Now()
	res, err := p.run(ctx, l, p)
	var stepErr *StepError
	switch {
	case errors.As(err, &stepErr):
		return out, err // names the pattern already
	case err != nil:
		return out, fmt.Errorf("pattern %s: %w", p.Name, err)
	}
	ids := make([]string, len(l.Reports))
	for i, r := range l.Reports {
		ids[i] = r.ID
	}
	rep := verify.Check(verify.Run{Input: ids, Output: res.outputs, Aborted: res.aborted})
	out.Faults = res.faults
	out.Output = len(res.outputs)
	out.Lost, out.Duplicated = rep.Lost.Count, rep.Duplicated.Count
	out.AbortedVisible, out.OutOfOrder = rep.AbortedVisible.Count, rep.OutOfOrder.Count
	out.Totals = res.totals
	out.TotalsCorrect = maps.Equal(res.totals, totals(l.Reports))
	out.TotalsVerdict = totalsVerdict(out.TotalsCorrect, p.Control)
	if res.days.checked {
		out.DaysVerdict = totalsVerdict(res.days.wrong == 0, p.Control)
		out.DaysWrong, out.Days, out.LateReports, out.Finals = res.days.wrong, res.days.days, res.days.late, res.days.finals
	}
	out.Report = rep
	out.Duration = time.Since(start)
	return out, nil
}

// totalsVerdict is what the table says of a row's totals: a control's
// correct totals are "not shown" (this run's faults missed), not "yes".
func totalsVerdict(correct, control bool) string {
	switch {
	case !correct:
		return "no"
	case control:
		return "not shown"
	}
	return "yes"
}

// outputOf turns a report read at pos into a verifier output: order is
// checked per region, by report number.
func outputOf(r dashboard.Report, pos verify.Position) verify.Output {
	n, _ := strconv.ParseInt(r.ID[1:], 10, 64)
	return verify.Output{ID: r.ID, Stream: r.Region, Seq: n, Position: pos}
}

// newTopics creates a run's topics, each with one partition per region.
func (l *Lab) newTopics(ctx context.Context, adm *kadm.Client, names ...string) error {
	return l.newTopicsWith(ctx, adm, nil, names...)
}

// newTopicsWith creates a run's topics, each with one partition per region
// and configs, and waits until every partition has a leader (topics.Ensure):
// the at-most-once source does not retry a write that a partition without
// its leader yet refuses.
func (l *Lab) newTopicsWith(ctx context.Context, adm *kadm.Client, configs map[string]string, names ...string) error {
	specs := make([]topics.Spec, len(names))
	for i, n := range names {
		specs[i] = topics.Spec{Name: n, Partitions: int32(len(regions)), ReplicationFactor: 1, Configs: configs}
	}
	if _, err := topics.Ensure(ctx, adm, specs...); err != nil {
		return fmt.Errorf("create topics %s: %w", strings.Join(names, ", "), err)
	}
	return nil
}

func (l *Lab) admin() (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(l.Brokers...))
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl.Close, nil
}

var notNameChars = regexp.MustCompile(`[^a-z0-9]+`)

// runName names a run's topics and group: Kafka names allow only
// [a-zA-Z0-9._-].
func runName(p Pattern) string {
	return fmt.Sprintf("eoslab-%s-%d", strings.Trim(notNameChars.ReplaceAllString(p.Name, "-"), "-"), time.Now().UnixNano())
}
