package patterns

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
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
)

// ErrStalled is returned by [Lab.Run] when a pattern made no progress for a
// minute: the run is abandoned rather than left hanging.
var ErrStalled = errors.New("patterns: run stalled")

const stallLimit = time.Minute

// Lab runs patterns on one workload with the same injected faults.
type Lab struct {
	// Brokers are the bootstrap addresses of the cluster to run on.
	Brokers []string
	// Pool is the PostgreSQL for the database patterns; nil skips them.
	Pool *pgxpool.Pool
	// Reports is the workload; default Workload(4000).
	Reports []Report
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
	// RecordDelay is how long each handler call works, which keeps
	// batches in flight when the faults strike. Default 500µs.
	RecordDelay time.Duration
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
}

func (l *Lab) progress(p Pattern, step string) {
	if l.Progress != nil {
		l.Progress(p.Name, step)
	}
}

func (l *Lab) clientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(l.SessionTimeout),
		// The 3 s default heartbeat would let a 3 s session expire.
		kgo.HeartbeatInterval(l.SessionTimeout / 4),
		kgo.RebalanceTimeout(l.SessionTimeout),
		kgo.TransactionTimeout(4 * l.SessionTimeout),
	}
}

// Outcome is what the verifier found for one pattern.
type Outcome struct {
	Pattern   string `json:"pattern"`
	Guarantee string `json:"guarantee"`
	// Skipped says why the pattern did not run, or did not finish ("" if
	// it ran).
	Skipped string `json:"skipped,omitempty"`
	// Faults lists the faults injected.
	Faults         []string           `json:"faults,omitempty"`
	Input          int                `json:"input"`
	Output         int                `json:"output"`
	Lost           int                `json:"lost"`
	Duplicated     int                `json:"duplicated"`
	AbortedVisible int                `json:"aborted_visible"`
	OutOfOrder     int                `json:"out_of_order"`
	Totals         map[string]int     `json:"totals,omitempty"`
	TotalsCorrect  bool               `json:"totals_correct"`
	Report         integration.Report `json:"-"`
	Duration       time.Duration      `json:"duration_ns"`
}

// Pattern is one reference pattern.
type Pattern struct {
	// Name is the pattern's short name, as the table prints it.
	Name string
	// Guarantee is what it promises.
	Guarantee string
	// NeedsDatabase marks the patterns whose results live in PostgreSQL.
	NeedsDatabase bool
	run           func(ctx context.Context, l *Lab, p Pattern) (result, error)
}

// result is what a pattern run leaves for the verifier.
type result struct {
	faults  []string
	outputs []integration.Output
	aborted map[integration.Position]bool
	totals  map[string]int
}

// All returns the patterns in the order the table lists them.
func All() []Pattern {
	return []Pattern{
		atMostOnce(), atLeastOnce(), exactlyOnceKafka(), exactlyOncePostgres(), dedupPostgres(), producerResume(),
	}
}

// Run runs p and verifies what it produced against the workload.
func (l *Lab) Run(ctx context.Context, p Pattern) (Outcome, error) {
	l.defaults()
	out := Outcome{Pattern: p.Name, Guarantee: p.Guarantee, Input: len(l.Reports)}
	if p.NeedsDatabase && l.Pool == nil {
		out.Skipped = "skipped: needs PostgreSQL (give --database-url, or run make demo)"
		return out, nil
	}
	start := time.Now()
	res, err := p.run(ctx, l, p)
	if err != nil {
		return out, fmt.Errorf("pattern %s: %w", p.Name, err)
	}
	ids := make([]string, len(l.Reports))
	for i, r := range l.Reports {
		ids[i] = r.ID
	}
	rep := integration.Verify(integration.Run{Input: ids, Output: res.outputs, Aborted: res.aborted})
	out.Faults = res.faults
	out.Output = len(res.outputs)
	out.Lost, out.Duplicated = rep.Lost.Count, rep.Duplicated.Count
	out.AbortedVisible, out.OutOfOrder = rep.AbortedVisible.Count, rep.OutOfOrder.Count
	out.Totals = res.totals
	out.TotalsCorrect = maps.Equal(res.totals, Totals(l.Reports))
	out.Report = rep
	out.Duration = time.Since(start)
	return out, nil
}

// outputOf turns a report read at pos into a verifier output: order is
// checked per region, by report number.
func outputOf(r Report, pos integration.Position) integration.Output {
	n, _ := strconv.ParseInt(r.ID[1:], 10, 64)
	return integration.Output{ID: r.ID, Stream: r.Region, Seq: n, Position: pos}
}

// gate paces the handlers of one pattern run, and turns the first handler
// call after it is armed into a zombie: that call blocks until released.
type gate struct {
	delay    time.Duration
	armed    atomic.Bool
	zombie   chan string // receives the name of the instance that stalled
	release  chan struct{}
	released atomic.Bool
}

func newGate(delay time.Duration) *gate {
	return &gate{delay: delay, zombie: make(chan string, 1), release: make(chan struct{})}
}

// wait does the handler's work for one record in the named instance, and
// stalls it if the gate is armed.
func (g *gate) wait(instance string) {
	time.Sleep(g.delay)
	if g.armed.CompareAndSwap(true, false) {
		g.zombie <- instance
		<-g.release
	}
}

func (g *gate) wake() {
	if g.released.CompareAndSwap(false, true) {
		close(g.release)
	}
}

// instance is one running consumer of a pattern.
type instance struct {
	cancel context.CancelFunc
	done   chan error
}

// launcher starts one instance of a consumer-side pattern: it runs until
// ctx ends, calling wait in its handler for each record.
type launcher func(ctx context.Context, name string, wait func()) error

// churn runs a consumer-side pattern through the lab's faults, in order: an
// instance stopped abruptly mid-batch and replaced (a crash between
// processing and committing); a second instance joining mid-batch (a
// rebalance); an instance stalled in its handler past the session timeout
// while a replacement with its name starts (a zombie), then woken. It
// returns once progress reports everything consumed and all instances
// stopped. Errors the faults are expected to cause (a fenced zombie) are
// not errors of the run.
func (l *Lab) churn(ctx context.Context, p Pattern, start launcher, progress func(context.Context) (done, total int64, err error)) ([]string, error) {
	var mu sync.Mutex
	var instances []*instance
	g := newGate(l.RecordDelay)
	defer g.wake()
	launch := func(name string) *instance {
		ictx, cancel := context.WithCancel(ctx)
		in := &instance{cancel: cancel, done: make(chan error, 1)}
		go func() { in.done <- start(ictx, name, func() { g.wait(name) }) }()
		mu.Lock()
		instances = append(instances, in)
		mu.Unlock()
		return in
	}
	reached := func(frac float64) error {
		last, since := int64(-1), time.Now()
		for {
			// A coordinator busy with a rebalance may hold the offset
			// fetch; that counts as no progress, not as an error.
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			done, total, err := progress(pctx)
			cancel()
			if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				done, total, err = last, 0, nil
			}
			if err != nil {
				return err
			}
			if total > 0 && float64(done) >= frac*float64(total) {
				return nil
			}
			if done > last {
				last, since = done, time.Now()
			} else if time.Since(since) > stallLimit {
				return fmt.Errorf("%w: no progress for %s at %d of %d records", ErrStalled, stallLimit, last, total)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	defer func() {
		for _, in := range instances {
			in.cancel()
			<-in.done
		}
	}()

	a := launch("a")
	if err := reached(0.25); err != nil {
		return nil, err
	}
	l.progress(p, "crash: stopping an instance abruptly mid-batch")
	a.cancel()
	launch("a")
	if err := reached(0.45); err != nil {
		return nil, err
	}
	l.progress(p, "rebalance: a second instance joins mid-batch")
	launch("b")
	if err := reached(0.65); err != nil {
		return nil, err
	}
	g.armed.Store(true)
	var zombie string
	select {
	case zombie = <-g.zombie:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	l.progress(p, "zombie: instance "+zombie+" stalls past its session timeout; a replacement starts")
	time.Sleep(l.SessionTimeout + 2*time.Second)
	launch(zombie)
	time.Sleep(l.SessionTimeout)
	l.progress(p, "zombie: instance "+zombie+" wakes up")
	g.wake()
	if err := reached(1); err != nil {
		return nil, err
	}
	// Let the last batches land before the instances stop.
	time.Sleep(2 * time.Second)
	l.progress(p, "stopping")
	return []string{"unknown outcome at the source", "crash mid-batch", "rebalance mid-batch", "zombie"}, nil
}

// groupProgress reports a group's committed offsets against the topic's
// end offsets.
func groupProgress(adm *kadm.Client, group, topic string) func(context.Context) (int64, int64, error) {
	return func(ctx context.Context) (int64, int64, error) {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = ends.Error()
		}
		if err != nil {
			return 0, 0, err
		}
		committed, err := adm.FetchOffsets(ctx, group)
		if err != nil && !errors.Is(err, context.Canceled) {
			return 0, 0, nil // the group may not exist yet
		}
		var done, total int64
		ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
		committed.Each(func(o kadm.OffsetResponse) {
			if o.Topic == topic && o.Err == nil {
				done += o.At
			}
		})
		return done, total, nil
	}
}

// newTopics creates a run's topics, each with one partition per region.
func (l *Lab) newTopics(ctx context.Context, adm *kadm.Client, names ...string) error {
	for _, n := range names {
		resp, err := adm.CreateTopic(ctx, int32(len(Regions)), 1, nil, n)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			return fmt.Errorf("create topic %s: %w", n, err)
		}
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
