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

// ErrStalled is wrapped by the *StepError that [Lab.Run] returns when a
// step of a pattern's run did not finish within [Lab.StepTimeout]: the run
// is abandoned rather than left hanging.
var ErrStalled = errors.New("patterns: run stalled")

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
}

func (e *StepError) Error() string {
	return fmt.Sprintf("pattern %s: step %q ended after %s at %d of %d records committed: %v",
		e.Pattern, e.Step, e.Waited.Round(time.Millisecond), e.Done, e.Total, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

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

func (l *Lab) clientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(l.SessionTimeout),
		// The 3 s default heartbeat would let a 3 s session expire.
		kgo.HeartbeatInterval(l.SessionTimeout / 4),
		kgo.RebalanceTimeout(l.SessionTimeout),
		kgo.TransactionTimeout(max(4*l.SessionTimeout, 10*time.Second)),
	}
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

// gate is where the lab's faults catch a handler mid-batch. Each handler
// call passes through it; once armed, the first call to arrive is caught:
// it blocks, its instance's name is sent to the lab, and it stays blocked
// until the lab releases it. Arming happens before the lab writes the next
// part of the workload, so some handler is certain to arrive, on a fast
// machine or a slow one.
type gate struct {
	delay  time.Duration
	mu     sync.Mutex
	armed  *catch // nil when disarmed
	closed bool
}

// catch is one armed fault: the instance caught, and its release.
type catch struct {
	caught   chan string // receives the caught instance's name
	release  chan struct{}
	released atomic.Bool
}

func (c *catch) free() {
	if c.released.CompareAndSwap(false, true) {
		close(c.release)
	}
}

func newGate(delay time.Duration) *gate { return &gate{delay: delay} }

// arm makes the next handler call block; the returned catch names it.
func (g *gate) arm() *catch {
	c := &catch{caught: make(chan string, 1), release: make(chan struct{})}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		c.free()
	} else {
		g.armed = c
	}
	return c
}

// wait does the handler's work for one record in the named instance, and
// blocks it if the gate is armed.
func (g *gate) wait(instance string) {
	time.Sleep(g.delay)
	g.mu.Lock()
	c := g.armed
	g.armed = nil
	g.mu.Unlock()
	if c != nil {
		c.caught <- instance
		<-c.release
	}
}

// close releases whatever is caught and lets every later call through.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	if g.armed != nil {
		g.armed.free()
		g.armed = nil
	}
}

// instance is one running consumer of a pattern.
type instance struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{} // closed once the instance returned
}

// launcher starts one instance of a consumer-side pattern: it runs until
// ctx ends, calling wait in its handler for each record.
type launcher func(ctx context.Context, name string, wait func()) error

// feeder writes l.Reports[from:to] to a pattern's input topic.
type feeder func(ctx context.Context, from, to int) error

// The workload is written in parts, each after the fault it feeds is
// armed: the fractions of it written before the crash, the rebalance and
// the zombie.
const (
	beforeCrash     = 0.3
	beforeRebalance = 0.5
	beforeZombie    = 0.7
)

// churn runs a consumer-side pattern through the lab's faults, in order: an
// instance stopped abruptly mid-batch and replaced (a crash between
// processing and committing); a second instance joining mid-batch (a
// rebalance); an instance stalled in its handler past its session timeout
// while a replacement with its name starts (a zombie), then woken. Each
// fault strikes while a handler is caught in the gate, so it lands
// mid-batch whatever the machine's speed. It writes the workload with feed,
// part by part, and returns once progress reports everything consumed and
// all instances stopped. Every wait is bounded by l.StepTimeout and fails
// with a *StepError naming its step. Errors the faults are expected to
// cause (a fenced zombie) are not errors of the run: the launcher filters
// them; any other error an instance returns ends the run.
func (l *Lab) churn(ctx context.Context, p Pattern, start launcher, feed feeder, progress func(context.Context) (done, total int64, err error)) ([]string, error) {
	ctx, cancelAll := context.WithCancel(ctx)
	defer cancelAll()
	g := newGate(l.RecordDelay)
	defer g.close()
	var instances []*instance
	failed := make(chan error, 16) // instances that returned an error of their own
	launch := func(name string) *instance {
		ictx, cancel := context.WithCancel(ctx)
		in := &instance{name: name, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(in.done)
			if err := start(ictx, name, func() { g.wait(name) }); err != nil && ictx.Err() == nil {
				select {
				case failed <- fmt.Errorf("instance %s: %w", name, err):
				default:
				}
			}
		}()
		instances = append(instances, in)
		return in
	}
	// Stop every instance on the way out, each within the step bound;
	// the gate is closed first so that no handler stays caught.
	defer func() {
		g.close()
		for _, in := range instances {
			in.cancel()
		}
		for _, in := range instances {
			select {
			case <-in.done:
			case <-time.After(l.StepTimeout):
				l.Logger.Error("patterns: an instance did not stop", "pattern", p.Name, "instance", in.name, "waited", l.StepTimeout)
			}
		}
	}()

	var last, total int64 // the progress last seen, for errors
	stalled := func(step string, began time.Time, err error) error {
		return &StepError{Pattern: p.Name, Step: step, Waited: time.Since(began), Done: last, Total: total, Err: err}
	}
	// reached waits until the committed offsets cover frac of the records
	// written so far.
	reached := func(step string, frac float64) error {
		began := time.Now()
		deadline := time.NewTimer(l.StepTimeout)
		defer deadline.Stop()
		for {
			// A coordinator busy with a rebalance may hold the offset
			// fetch; that counts as no progress, not as an error.
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			done, tot, err := progress(pctx)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
			case err != nil:
				return stalled(step, began, err)
			default:
				last, total = done, tot
				if tot > 0 && float64(done) >= frac*float64(tot) {
					return nil
				}
			}
			select {
			case <-ctx.Done():
				return stalled(step, began, ctx.Err())
			case err := <-failed:
				return stalled(step, began, err)
			case <-deadline.C:
				return stalled(step, began, ErrStalled)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	n := len(l.Reports)
	part := func(f float64) int { return int(float64(n) * f) }
	catchOne := func(step string, c *catch) (string, error) {
		began := time.Now()
		select {
		case name := <-c.caught:
			return name, nil
		case <-ctx.Done():
			return "", stalled(step, began, ctx.Err())
		case err := <-failed:
			return "", stalled(step, began, err)
		case <-time.After(l.StepTimeout):
			return "", stalled(step, began, fmt.Errorf("%w: no handler reached the fault", ErrStalled))
		}
	}
	stop := func(step string, in *instance) error {
		began := time.Now()
		in.cancel()
		select {
		case <-in.done:
			return nil
		case <-time.After(l.StepTimeout):
			return stalled(step, began, fmt.Errorf("%w: instance %s did not stop", ErrStalled, in.name))
		}
	}
	pause := func(step string, d time.Duration) error {
		select {
		case <-ctx.Done():
			return stalled(step, time.Now(), ctx.Err())
		case err := <-failed:
			return stalled(step, time.Now(), err)
		case <-time.After(d):
			return nil
		}
	}

	// Crash: instance a is caught mid-batch and stopped abruptly; a
	// replacement with its name starts.
	if err := feed(ctx, 0, part(beforeCrash)); err != nil {
		return nil, err
	}
	a := launch("a")
	if err := reached("crash: waiting for the first commits", 0.5); err != nil {
		return nil, err
	}
	c := g.arm()
	if err := feed(ctx, part(beforeCrash), part(beforeRebalance)); err != nil {
		return nil, err
	}
	if _, err := catchOne("crash: waiting for a handler mid-batch", c); err != nil {
		return nil, err
	}
	l.progress(p, "crash: stopping an instance abruptly mid-batch")
	a.cancel()
	c.free()
	if err := stop("crash: waiting for the crashed instance to stop", a); err != nil {
		return nil, err
	}
	launch("a")

	// Rebalance: a second instance joins while the first is caught
	// mid-batch, held long enough for the first to learn of the
	// rebalance from a heartbeat.
	c = g.arm()
	if err := feed(ctx, part(beforeRebalance), part(beforeZombie)); err != nil {
		return nil, err
	}
	if _, err := catchOne("rebalance: waiting for a handler mid-batch", c); err != nil {
		return nil, err
	}
	l.progress(p, "rebalance: a second instance joins mid-batch")
	launch("b")
	err := pause("rebalance: holding the batch while b joins", l.SessionTimeout/4+time.Second)
	c.free()
	if err != nil {
		return nil, err
	}

	// Zombie: the next handler to arrive stalls past its session
	// timeout, a replacement with its name starts, then it wakes.
	c = g.arm()
	if err := feed(ctx, part(beforeZombie), n); err != nil {
		return nil, err
	}
	zombie, err := catchOne("zombie: waiting for a handler mid-batch", c)
	if err != nil {
		return nil, err
	}
	l.progress(p, "zombie: instance "+zombie+" stalls past its session timeout; a replacement starts")
	if err := pause("zombie: stalled", l.SessionTimeout+2*time.Second); err != nil {
		c.free()
		return nil, err
	}
	launch(zombie)
	err = pause("zombie: replacement running", l.SessionTimeout)
	l.progress(p, "zombie: instance "+zombie+" wakes up")
	c.free()
	if err != nil {
		return nil, err
	}
	if err := reached("finishing: waiting for every record's commit", 1); err != nil {
		return nil, err
	}
	// Let the last batches land, and a woken zombie do what it does,
	// before the instances stop.
	if err := pause("finishing", 2*time.Second); err != nil {
		return nil, err
	}
	l.progress(p, "stopping")
	for _, in := range instances {
		if err := stop("stopping the instances", in); err != nil {
			return nil, err
		}
	}
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
