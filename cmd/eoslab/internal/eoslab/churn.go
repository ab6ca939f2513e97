package eoslab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/testsupport/groupdesc"
)

// gate is where the lab's faults catch a handler mid-batch. Each handler
// call passes through it; once armed, the first call to arrive is caught:
// it blocks, its instance's name is sent to the lab, and it stays blocked
// until the lab releases it, its instance is stopped, or the gate closes.
// Arming happens before the lab writes the next part of the workload, so
// some handler is certain to arrive, on a fast machine or a slow one.
type gate struct {
	delay  time.Duration
	closed chan struct{}
	once   sync.Once
	mu     sync.Mutex
	armed  *catch // nil when disarmed
	// holding is a catch that holds every call of the launch it caught
	// (see arm's whole), until released.
	holding *catch
}

// catch is one armed fault: the processor whose call it catches ("":
// any), whether it then holds every call of that launch (whole), the
// handler call caught, and its release.
type catch struct {
	processor string
	whole     bool
	launch    string    // the launch caught, once caught (g.mu)
	caught    chan call // receives the call caught
	release   chan struct{}
	released  atomic.Bool
}

func (c *catch) free() {
	if c.released.CompareAndSwap(false, true) {
		close(c.release)
	}
}

func newGate(delay time.Duration) *gate { return &gate{delay: delay, closed: make(chan struct{})} }

// arm makes the next handler call of processor ("": of any) block, and
// with whole every later call of the same launch (its other processors'
// too: a zombie stalls whole); the returned catch names the call.
func (g *gate) arm(processor string, whole bool) *catch {
	c := &catch{processor: processor, whole: whole, caught: make(chan call, 1), release: make(chan struct{})}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = c
	return c
}

// call is a handler call the gate caught: its instance, and which of the
// instance's processors ("" when it runs one) made it.
type call struct{ instance, processor string }

func (c call) String() string {
	if c.processor == "" {
		return c.instance
	}
	return c.instance + " (" + c.processor + ")"
}

// wait does the handler's work for one record of processor in the named
// instance (launch: this run of it), and blocks it if the gate is armed
// for it, or holds that launch whole.
func (g *gate) wait(ctx context.Context, instance, launch, processor string) {
	time.Sleep(g.delay)
	g.mu.Lock()
	c := g.armed
	if c != nil && c.processor != "" && c.processor != processor {
		c = nil // armed for another processor's call
	}
	if c != nil {
		g.armed = nil
		if c.whole {
			c.launch, g.holding = launch, c
		}
		c.caught <- call{instance, processor} // buffered, sent once: never blocks
	} else if h := g.holding; h != nil && h.launch == launch && !h.released.Load() {
		c = h // a call of the launch held whole
	}
	g.mu.Unlock()
	if c == nil {
		return
	}
	select {
	case <-c.release:
	case <-ctx.Done():
	case <-g.closed:
	}
}

// close releases whatever is caught, now and later.
func (g *gate) close() { g.once.Do(func() { close(g.closed) }) }

// instance is one running consumer of a pattern.
type instance struct {
	name     string
	clientID string
	cancel   context.CancelFunc
	done     chan struct{} // closed once the instance returned
}

// launcher starts one instance of a consumer-side pattern: it runs until
// ctx ends, with opts added to its client's options (they name the client,
// so that the lab can find it in the group), calling wait in its handler
// for each record, with the processor it is of when an instance runs
// several (the evidence names the one caught), or "".
type launcher func(ctx context.Context, name string, opts []kgo.Opt, wait func(processor string)) error

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

// minReports is the smallest workload whose parts all hold records.
const minReports = 40

// churnRun is one pattern's run through the faults (see [Lab.churn]).
type churnRun struct {
	l        *Lab
	p        Pattern
	ctx      context.Context
	start    launcher
	feed     feeder
	progress func(context.Context) (done, total int64, err error)
	group    func(context.Context) (groupView, error)
	// offsets describes the group's committed offsets against the
	// input's ends, partition by partition, for a stall's error (nil:
	// not described).
	offsets func(context.Context) (string, error)
	// processors are those each instance runs, when several, the one
	// whose group the lab watches first (see target).
	processors []string
	gate       *gate
	instances  []*instance
	launched   int
	failed     chan error // instances that returned an error of their own
	evidence   []string   // what each fault did, as seen from outside
	// last and total are the progress last seen, for errors.
	last, total int64
}

// groupView is the consumer group as DescribeGroups shows it.
type groupView struct {
	state     string
	clientIDs map[string]bool
	// assigned is each member's partitions of the input, as
	// "client-id [0 2]", sorted.
	assigned []string
}

func (v groupView) String() string {
	if len(v.assigned) == 0 {
		return v.state + ", no members"
	}
	return v.state + ", members " + strings.Join(v.assigned, ", ")
}

// churn runs a consumer-side pattern through the lab's faults, in order: an
// instance stopped abruptly mid-batch and replaced (a crash between
// processing and committing); a second instance joining mid-batch (a
// rebalance); an instance stalled in its handler while a replacement with
// its name starts and the group rebalances without it (a zombie), then
// woken. Each fault strikes while a handler is caught in the gate, so it
// lands mid-batch whatever the machine's speed, and each step waits for
// the group to show the fault took hold. It writes the workload with feed,
// part by part, and returns the faults with their evidence once progress
// reports everything consumed and all instances stopped. Every wait is
// bounded by l.StepTimeout and fails with a *StepError naming its step,
// the group's members and their partitions, and (offsets, if not nil) the
// committed offsets of each partition. When each instance runs several
// processors (processors, the names its launcher gives wait, the one
// whose group the lab watches first), the crash catches a call of the
// last and the rebalance and the zombie one of the first (the zombie then
// holds every call of its instance), and each fault's evidence names the
// processor caught.
// Errors the faults are expected to cause (a fenced zombie) are not errors
// of the run: the launcher filters them; any other error an instance
// returns ends the run.
func (l *Lab) churn(ctx context.Context, p Pattern, start launcher, feed feeder,
	progress func(context.Context) (done, total int64, err error), group func(context.Context) (groupView, error),
	offsets func(context.Context) (string, error), processors ...string,
) ([]string, error) {
	if len(l.Reports) < minReports {
		return nil, fmt.Errorf("eoslab: a run needs at least %d reports, not %d", minReports, len(l.Reports))
	}
	ctx, cancelAll := context.WithCancel(ctx)
	defer cancelAll()
	r := &churnRun{l: l, p: p, ctx: ctx, start: start, feed: feed, progress: progress, group: group,
		offsets: offsets, processors: processors, gate: newGate(l.RecordDelay), failed: make(chan error, 16)}
	defer r.stopAll()
	if err := r.faults(); err != nil {
		return nil, err
	}
	return append([]string{"unknown outcome at the source"}, r.evidence...), nil
}

// target is the processor whose call fault (0 the crash, 1 the
// rebalance, 2 the zombie) catches, "" (any) when the instances run one:
// the crash, which watches no group, the last of several, and the
// others the first, whose group the lab watches rebalance.
func (r *churnRun) target(fault int) string {
	switch {
	case len(r.processors) == 0:
		return ""
	case fault == 0:
		return r.processors[len(r.processors)-1]
	default:
		return r.processors[0]
	}
}

func (r *churnRun) faults() error {
	l, n := r.l, len(r.l.Reports)
	part := func(f float64) int { return int(float64(n) * f) }

	// Crash: instance a is caught mid-batch and stopped abruptly; a
	// replacement with its name starts.
	if err := r.write("crash: writing the first reports", 0, part(beforeCrash)); err != nil {
		return err
	}
	a := r.launch("a")
	if err := r.reached("crash: waiting for the first commits", 0.5); err != nil {
		return err
	}
	c := r.gate.arm(r.target(0), false)
	if err := r.write("crash: writing the reports it strikes in", part(beforeCrash), part(beforeRebalance)); err != nil {
		return err
	}
	crashed, err := r.catchOne("crash: waiting for a handler mid-batch", c)
	if err != nil {
		return err
	}
	l.progress(r.p, "crash: stopping an instance abruptly mid-batch")
	a.cancel()
	c.free()
	if err := r.stop("crash: waiting for the crashed instance to stop", a); err != nil {
		return err
	}
	r.evidence = append(r.evidence, fmt.Sprintf("crash mid-batch: instance %s stopped with a handler call in flight", crashed))
	r.launch("a")

	// Rebalance: a second instance joins while the first is caught
	// mid-batch, held until the group is rebalancing and then for one
	// more heartbeat, so that the first learns of it mid-batch.
	c = r.gate.arm(r.target(1), false)
	if err := r.write("rebalance: writing the reports it strikes in", part(beforeRebalance), part(beforeZombie)); err != nil {
		return err
	}
	held, err := r.catchOne("rebalance: waiting for a handler mid-batch", c)
	if err != nil {
		return err
	}
	l.progress(r.p, "rebalance: a second instance joins mid-batch")
	b := r.launch("b")
	view, err := r.awaitGroup("rebalance: waiting for the group to see the second instance", func(v groupView) bool {
		return v.state != "Stable" || v.clientIDs[b.clientID]
	})
	if err == nil {
		err = r.pause("rebalance: holding the batch for a heartbeat", l.heartbeat()+200*time.Millisecond)
	}
	c.free()
	if err != nil {
		return err
	}
	r.evidence = append(r.evidence, fmt.Sprintf("rebalance mid-batch: b joined (group %s) while %s held a handler call", view.state, held))

	// Zombie: the next handler to arrive stalls; a replacement with its
	// name starts, and the group rebalances without the stalled one
	// (evicted, or stripped of its partitions); then it wakes.
	c = r.gate.arm(r.target(2), true)
	if err := r.write("zombie: writing the reports it strikes in", part(beforeZombie), n); err != nil {
		return err
	}
	zombie, err := r.catchOne("zombie: waiting for a handler mid-batch", c)
	if err != nil {
		return err
	}
	l.progress(r.p, "zombie: instance "+zombie.String()+" stalls past its session timeout; a replacement starts")
	if err := r.pause("zombie: stalled past its session timeout", l.SessionTimeout+time.Second); err != nil {
		c.free()
		return err
	}
	replacement := r.launch(zombie.instance)
	view, err = r.awaitGroup("zombie: waiting for the group to rebalance onto the replacement", func(v groupView) bool {
		return v.state == "Stable" && v.clientIDs[replacement.clientID]
	})
	l.progress(r.p, "zombie: instance "+zombie.instance+" wakes up")
	c.free()
	if err != nil {
		return err
	}
	whole := ""
	if len(r.processors) > 1 {
		whole = ", every processor of it held"
	}
	r.evidence = append(r.evidence, fmt.Sprintf("zombie: %s stalled mid-batch%s, while the group (%d members) rebalanced onto its replacement", zombie, whole, len(view.clientIDs)))

	if err := r.reached("finishing: waiting for every record's commit", 1); err != nil {
		return err
	}
	// Let the last batches land, and a woken zombie do what it does,
	// before the instances stop.
	if err := r.pause("finishing", 2*time.Second); err != nil {
		return err
	}
	l.progress(r.p, "stopping")
	for _, in := range r.instances {
		if err := r.stop("stopping the instances", in); err != nil {
			return err
		}
	}
	select {
	case err := <-r.failed:
		return r.stalled("stopping the instances", time.Now(), err)
	default:
	}
	return nil
}

func (r *churnRun) launch(name string) *instance {
	r.launched++
	ictx, cancel := context.WithCancel(r.ctx)
	in := &instance{name: name, clientID: fmt.Sprintf("eoslab-%s-%d", name, r.launched), cancel: cancel, done: make(chan struct{})}
	opts := append(r.l.clientOpts(), kgo.ClientID(in.clientID))
	go func() {
		defer close(in.done)
		if err := r.start(ictx, name, opts, func(processor string) { r.gate.wait(ictx, name, in.clientID, processor) }); err != nil && ictx.Err() == nil {
			select {
			case r.failed <- fmt.Errorf("instance %s: %w", name, err):
			default:
			}
		}
	}()
	r.instances = append(r.instances, in)
	return in
}

// stopAll stops every instance on the way out, all within one step bound;
// the gate is closed first so that no handler stays caught.
func (r *churnRun) stopAll() {
	r.gate.close()
	for _, in := range r.instances {
		in.cancel()
	}
	deadline := time.After(r.l.StepTimeout)
	for _, in := range r.instances {
		select {
		case <-in.done:
		case <-deadline:
			r.l.Logger.Error("eoslab: an instance did not stop", "pattern", r.p.Name, "instance", in.name, "waited", r.l.StepTimeout)
			return
		}
	}
}

func (r *churnRun) stalled(step string, began time.Time, err error) error {
	e := &StepError{Pattern: r.p.Name, Step: step, Waited: time.Since(began), Done: r.last, Total: r.total, Err: err}
	if errors.Is(err, ErrStalled) {
		e.State = r.describeStall()
	}
	return e
}

// describeStall says where the group stood at a stall, within a few
// seconds (an answer missing says why).
func (r *churnRun) describeStall() string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 5*time.Second)
	defer cancel()
	var parts []string
	if v, err := r.group(ctx); err != nil {
		parts = append(parts, fmt.Sprintf("group not described: %v", err))
	} else {
		parts = append(parts, "group "+v.String())
	}
	if r.offsets != nil {
		if o, err := r.offsets(ctx); err != nil {
			parts = append(parts, fmt.Sprintf("offsets not read: %v", err))
		} else {
			parts = append(parts, "committed/end "+o)
		}
	}
	return strings.Join(parts, "; ")
}

// wait waits until d passes (ok), or fails the step when ctx ends, an
// instance fails or the step's bound passes first.
func (r *churnRun) wait(step string, began time.Time, d <-chan time.Time, bound <-chan time.Time) error {
	select {
	case <-r.ctx.Done():
		return r.stalled(step, began, r.ctx.Err())
	case err := <-r.failed:
		return r.stalled(step, began, err)
	case <-bound:
		return r.stalled(step, began, ErrStalled)
	case <-d:
		return nil
	}
}

// write feeds reports [from, to) within the step bound.
func (r *churnRun) write(step string, from, to int) error {
	began := time.Now()
	ctx, cancel := context.WithTimeout(r.ctx, r.l.StepTimeout)
	defer cancel()
	if err := r.feed(ctx, from, to); err != nil {
		if ctx.Err() != nil && r.ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", ErrStalled, err)
		}
		return r.stalled(step, began, err)
	}
	return nil
}

// reached waits until the committed offsets cover frac of the records
// written so far.
func (r *churnRun) reached(step string, frac float64) error {
	began := time.Now()
	bound := time.NewTimer(r.l.StepTimeout)
	defer bound.Stop()
	for {
		// A coordinator busy with a rebalance may hold the offset
		// fetch; that counts as no progress, not as an error.
		pctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
		done, total, err := r.progress(pctx)
		cancel()
		switch {
		case err != nil && r.ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		case err != nil:
			return r.stalled(step, began, err)
		case total > 0:
			r.last, r.total = done, total
			if float64(done) >= frac*float64(total) {
				return nil
			}
		}
		if err := r.wait(step, began, time.After(50*time.Millisecond), bound.C); err != nil {
			return err
		}
	}
}

// awaitGroup waits until the consumer group's view satisfies cond.
func (r *churnRun) awaitGroup(step string, cond func(groupView) bool) (groupView, error) {
	began := time.Now()
	bound := time.NewTimer(r.l.StepTimeout)
	defer bound.Stop()
	for {
		gctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
		v, err := r.group(gctx)
		cancel()
		if err == nil && cond(v) {
			return v, nil
		}
		if err := r.wait(step, began, time.After(50*time.Millisecond), bound.C); err != nil {
			return v, err
		}
	}
}

// catchOne waits for a handler to be caught by c; on failure it frees c,
// so that a handler caught late does not stay blocked.
func (r *churnRun) catchOne(step string, c *catch) (call, error) {
	began := time.Now()
	bound := time.NewTimer(r.l.StepTimeout)
	defer bound.Stop()
	select {
	case caught := <-c.caught:
		return caught, nil
	case <-r.ctx.Done():
		c.free()
		return call{}, r.stalled(step, began, r.ctx.Err())
	case err := <-r.failed:
		c.free()
		return call{}, r.stalled(step, began, err)
	case <-bound.C:
		c.free()
		return call{}, r.stalled(step, began, fmt.Errorf("%w: no handler reached the fault", ErrStalled))
	}
}

func (r *churnRun) stop(step string, in *instance) error {
	began := time.Now()
	in.cancel()
	select {
	case <-in.done:
		return nil
	case <-time.After(r.l.StepTimeout):
		return r.stalled(step, began, fmt.Errorf("%w: instance %s did not stop", ErrStalled, in.name))
	}
}

// pause waits d, failing the step if the run ends or an instance fails.
func (r *churnRun) pause(step string, d time.Duration) error {
	return r.wait(step, time.Now(), time.After(d), nil)
}

// describeGroup returns a function reading the group's state and members.
func describeGroup(adm *kadm.Client, group, topic string) func(context.Context) (groupView, error) {
	return func(ctx context.Context) (groupView, error) {
		described, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return groupView{}, err
		}
		d, ok := described[group]
		if !ok || d.Err != nil {
			return groupView{}, fmt.Errorf("describe group %s: %v", group, d.Err)
		}
		v := groupView{state: d.State, clientIDs: map[string]bool{}}
		for _, m := range d.Members {
			v.clientIDs[m.ClientID] = true
			v.assigned = append(v.assigned, fmt.Sprintf("%s %v", m.ClientID, groupdesc.Assigned(m, topic)))
		}
		slices.Sort(v.assigned)
		return v, nil
	}
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

// groupOffsets describes a group's committed offsets on topic against its
// end offsets, partition by partition ("0: 610/1000, 1: 1000/1000").
func groupOffsets(adm *kadm.Client, group, topic string) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = ends.Error()
		}
		if err != nil {
			return "", err
		}
		committed, err := adm.FetchOffsets(ctx, group)
		if err == nil {
			err = committed.Error()
		}
		if err != nil {
			return "", err
		}
		var listed []kadm.ListedOffset
		ends.Each(func(end kadm.ListedOffset) { listed = append(listed, end) })
		slices.SortFunc(listed, func(a, b kadm.ListedOffset) int { return int(a.Partition - b.Partition) })
		parts := make([]string, len(listed))
		for i, end := range listed {
			at := int64(-1) // nothing committed
			if o, ok := committed.Lookup(topic, end.Partition); ok {
				at = o.At
			}
			parts[i] = fmt.Sprintf("%d: %d/%d", end.Partition, at, end.Offset)
		}
		return strings.Join(parts, ", "), nil
	}
}
