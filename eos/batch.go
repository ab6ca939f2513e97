package eos

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/loop"
)

// coords names an input record.
type coords struct {
	topic     string
	partition int32
	offset    int64
}

func coordsOf(r *kgo.Record) coords { return coords{r.Topic, r.Partition, r.Offset} }

// batch is the work of one transaction: the inputs handled, the outputs
// produced, and what went wrong first. Lanes handle its records at once and
// its outputs' promises return on franz-go's goroutines: a record's outcome
// is applied (apply) and an output's noted (produceAll) under mu.
type batch struct {
	start    time.Time
	promises promises // outputs whose promise has not returned
	// ends is, per input partition, the offset after the last input
	// polled: where the group's offset stands if the batch committed.
	// Only collect's goroutine notes it (lanes never read it); it is read
	// once the batch ended.
	ends map[topicPartition]int64

	// mu guards the fields below.
	mu      sync.Mutex
	in, out int
	first   coords // the first input handled
	// failedAt is the input whose handler failed first, under Stop or
	// Retry (or for being too slow), and failed its error.
	failedAt coords
	failed   error
	// shutdown is set when Run's ctx ended (past the drain) as a record
	// was handled. Whatever else failed once ctx ended failed for it too:
	// the loops take ctx's end as a shutdown as well.
	shutdown bool
	// overBudget is set when the batch ran out of its transaction's
	// budget before its polled records were handled; next is then how
	// many records the next transaction takes.
	overBudget bool
	next       int
	// deadLetters holds the inputs this batch sent to the dead-letter
	// topic, with the error that sent them there.
	deadLetters map[coords]error

	// produce is the first output that failed, produceAt its input and
	// produceTopic its topic; failedInputs holds every input whose
	// outputs failed.
	produce      error
	produceAt    coords
	produceTopic string
	failedInputs map[coords]bool
	firsts       map[topicPartition]int64 // first offset written per output partition
}

// wrote notes an output the broker acknowledged.
func (b *batch) wrote(r *kgo.Record) {
	b.mu.Lock()
	defer b.mu.Unlock()
	tp := topicPartition{r.Topic, r.Partition}
	if first, ok := b.firsts[tp]; !ok || r.Offset < first {
		if b.firsts == nil {
			b.firsts = map[topicPartition]int64{}
		}
		b.firsts[tp] = r.Offset
	}
}

// noteEnds notes, per partition, the offset after the last record of a
// handled poll (once per partition, not per record).
func (b *batch) noteEnds(fetches kgo.Fetches) {
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if n := len(p.Records); n > 0 {
			if b.ends == nil {
				b.ends = map[topicPartition]int64{}
			}
			b.ends[topicPartition{p.Topic, p.Partition}] = p.Records[n-1].Offset + 1
		}
	})
}

// failedInputCount is how many inputs had an output fail.
func (b *batch) failedInputCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.failedInputs)
}

// produceErr returns the first output that failed, and its input.
func (b *batch) produceErr() (coords, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.produceAt, b.produce
}

// take counts the input at into the batch, under b.mu.
func (b *batch) take(at coords) {
	b.in++
	if b.in == 1 {
		b.first = at
	}
}

// apply applies o, the outcome of the input at, to the batch, under b.mu,
// and to what the processor remembers of failed inputs (f).
func (b *batch) apply(at coords, o recordOutcome, f *failures) {
	switch o.kind {
	case shutDown:
		b.shutdown = true
	case outOfBudget:
		// Lanes may run out of the budget together: the fewest
		// records asked for win.
		if !b.overBudget || o.next < b.next {
			b.next = o.next
		}
		b.overBudget = true
		if o.err != nil {
			f.poison(at, o.err)
		}
	case recordFailed:
		if b.failed == nil {
			b.failedAt, b.failed = at, o.err
		}
	case sendDeadLetter:
		if b.deadLetters == nil {
			b.deadLetters = map[coords]error{}
		}
		b.deadLetters[at] = o.err
	}
	b.out += len(o.outs)
}

// runner is what the two loops share: how to produce within the current
// batch and how to handle one record.
type runner struct {
	p       *Processor
	produce func(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))
	flush   func(ctx context.Context) error
	// isolate makes the next batch settle each input's outputs before
	// the next input is handled: set after a failure that several
	// inputs' outputs shared, so that a failure is traced to one input.
	isolate bool
	// budget bounds how long a transaction may take to handle its
	// records (0: no bound, outside transactions).
	budget time.Duration
	// stop ends with Run's ctx: no more polls, the batch under way
	// commits what it handled (see DrainTimeout).
	stop context.Context
	// pauser pauses and resumes the partitions of lanes fed across polls
	// (see feed); perRecord is the time a lane takes for one record, in
	// nanoseconds (an average over recent records; 0 until one is known).
	pauser    pauser
	perRecord atomic.Int64
}

func newRunner(p *Processor, cl *kgo.Client, produce func(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))) *runner {
	return &runner{p: p, produce: produce, flush: cl.Flush, stop: context.Background(), pauser: cl}
}

// handle runs the handler on r, under hctx (ctx bounded by the
// transaction's budget), and produces its outputs (or, for a failing record
// under DeadLetter, the dead letter). It returns false when the batch must
// end without committing.
//
// Lanes may call it at once (see feed): it notes what happened to r
// (an attempt), lets decide make that r's outcome, and applies the outcome
// to the batch under b.mu, never held while the handler runs. before is
// how many records r's lane handled before it in the batch, the ones that
// may have held it up (the lanes beside it did not), or -1 when records
// are handled one at a time (then every record the batch handled).
func (rn *runner) handle(ctx, hctx context.Context, b *batch, r *kgo.Record, before int) bool {
	at := coordsOf(r)
	a := attempt{in: r}
	b.mu.Lock()
	a.shutdown = ctx.Err() != nil
	// The budget ran out before this record, the batch holding others:
	// the batch ends. (A first record runs, to find out whether it alone
	// is too slow.)
	a.outOfBudget = !a.shutdown && b.in > 0 && hctx.Err() != nil
	if a.shutdown || a.outOfBudget {
		a.others = b.in
		rn.conclude(b, at, a)
		b.mu.Unlock()
		return false
	}
	b.take(at)
	b.mu.Unlock()

	a.err, a.poisoned = rn.p.failures.poisonedBy(at)
	var call *stateCtx // the handler's writes to the keyed state, if any
	if !a.poisoned {
		var cctx context.Context = hctx
		if rn.p.state != nil {
			txn, memo := rn.p.state.txn(r.Partition)
			call = withScope(hctx, txn, &rn.p.handlerState, memo)
			cctx = call
		}
		a.outs, a.took, a.err = rn.callHandler(cctx, r)
		a.shutdown = ctx.Err() != nil
		a.outOfBudget = !a.shutdown && a.err != nil && hctx.Err() != nil && errors.Is(a.err, hctx.Err())
	}
	b.mu.Lock()
	a.others = b.in - 1
	if before >= 0 {
		a.others = before
	}
	o := rn.conclude(b, at, a)
	b.mu.Unlock()
	if call != nil {
		// A record's writes count only with its outputs: a dead letter,
		// or a failure the transaction aborts for, leaves none.
		if o.kind == produceOutputs {
			call.keep()
		} else {
			call.scope.Drop()
		}
	}
	if !o.goesOn() {
		return false
	}
	if o.kind == sendDeadLetter {
		rn.p.deadLetterLog.Log(r.Topic, r.Partition, r.Offset, o.err, "dead_letter_topic", o.outs[0].Topic)
	}
	if len(o.outs) == 0 {
		return true
	}
	rn.produceAll(ctx, b, at, o.outs)
	if rn.isolate {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		err := b.promises.settle(sctx, rn.flush)
		cancel()
		if _, produceErr := b.produceErr(); err != nil || produceErr != nil {
			return false // this input's outputs failed, and no later input's
		}
	}
	return true
}

// conclude makes a, what happened to the input at, its outcome, and
// applies the outcome to b, whose mutex the caller holds.
func (rn *runner) conclude(b *batch, at coords, a attempt) recordOutcome {
	if a.outOfBudget && a.others == 0 {
		a.slowAlone = rn.p.failures.ranOutAlone(at)
	}
	o := decide(a, rn.p.cfg.onError, rn.budget)
	b.apply(at, o, rn.p.failures)
	return o
}

// produceAll produces the outputs of the input at, with one promise for
// all of them (it knows their input, so that a failed output is traced to
// it).
// produceUnblamed returns a produce function for records of b's
// transaction that no input is to blame for (the keyed state's changelog
// and updates): their promises count for b's commit and their offsets
// for its first writes, and the caller settles what failed.
func (rn *runner) produceUnblamed(b *batch) func(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	return func(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
		b.promises.add()
		rn.produce(ctx, r, func(r *kgo.Record, err error) {
			defer b.promises.done()
			if err == nil {
				b.wrote(r)
			}
			promise(r, err)
		})
	}
}

func (rn *runner) produceAll(ctx context.Context, b *batch, at coords, outs []*kgo.Record) {
	b.promises.addN(len(outs))
	promise := func(out *kgo.Record, err error) {
		defer b.promises.done()
		if err == nil {
			b.wrote(out)
			return
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.failedInputs == nil {
			b.failedInputs = map[coords]bool{}
		}
		b.failedInputs[at] = true
		if b.produce == nil {
			b.produce, b.produceAt, b.produceTopic = err, at, out.Topic
		}
	}
	for _, out := range outs {
		// The values of the handler's own context on the output (a
		// tracing span kotel links to, say) are kept; not its
		// cancellation, which franz-go would take as the record's (a
		// handler's ctx ends with its batch). An output without one
		// takes ctx, as before, without an allocation per record.
		if out.Context != nil {
			out.Context = context.WithoutCancel(out.Context)
		} else {
			out.Context = ctx
		}
		rn.produce(ctx, out, promise)
	}
}

// pollPerLane bounds one poll to this many records per lane (per
// [Concurrency]), so that a batch looks at its commit interval (and for a
// revocation) at least that often however many MaxRecordsPerCommit lets
// it hold.
const pollPerLane = 1000

// maxPoll is the most records one poll takes.
func (c *config) maxPoll() int { return pollPerLane * c.concurrency }

// collect handles records from first and from further polls until the batch
// is full, its interval is over, a rebalance took partitions, or a record
// failed. It reports whether every record was handled. Under Concurrency
// above 1 (and not isolating a failure), lanes fed across polls handle
// them (collectFed); otherwise they are handled one at a time, a poll at
// a time.
//
// A transaction's offsets cover every record polled into it, so a batch
// cannot commit before its last polled record is handled. When the budget
// runs out first, the batch ends without committing (the broker would abort
// it at the timeout anyway) and the processor takes fewer records per
// transaction.
func (rn *runner) collect(ctx context.Context, b *batch, first kgo.Fetches, poll func(context.Context, int) kgo.Fetches, revoked *atomic.Bool) bool {
	cfg := rn.p.cfg
	hctx := ctx
	if rn.budget > 0 {
		var cancel context.CancelFunc
		hctx, cancel = context.WithDeadline(ctx, b.start.Add(rn.budget))
		defer cancel()
	}
	limit := rn.p.perTxn
	var assignments int64 // a stateful processor's, when the batch began
	if rn.p.state != nil {
		assignments = rn.p.state.assignments.Load()
	}
	// A partition assigned meanwhile must be restored before its records
	// are handled, which the next transaction does first.
	assigned := func() bool { return rn.p.state != nil && rn.p.state.moreAssigned(assignments) }
	if cfg.concurrency > 1 && !rn.isolate {
		return rn.collectFed(ctx, hctx, b, first, poll, revoked, limit, assigned)
	}
	fetches := first
	for {
		handled := true
		fetches.EachRecord(func(r *kgo.Record) {
			handled = handled && rn.handle(ctx, hctx, b, r, -1)
		})
		if !handled {
			return false
		}
		b.noteEnds(fetches)
		if ctx.Err() != nil {
			return false // past the drain: the loop ends the batch as shut down
		}
		remaining := time.Until(b.start.Add(cfg.commitInterval))
		if b.in >= limit || remaining <= 0 || revoked.Load() || rn.stop.Err() != nil || assigned() {
			// Stopping (Run's ctx ended): commit what was handled,
			// every polled record included, while the drain lasts.
			return true
		}
		pollCtx, cancel := context.WithTimeout(rn.stop, remaining)
		fetches = poll(pollCtx, rn.pollSize(limit-b.in))
		rn.p.obs.Fetched(fetches)
		cancel()
		if ctx.Err() != nil {
			return false
		}
		loop.LogFetchErrors(fetches, rn.p.logger)
		// A partition assigned between the check above and this poll,
		// with records in it: restored here, inside the transaction
		// (rare; a restore that fails aborts it, and the session
		// restarts).
		if rn.p.state != nil {
			if err := rn.p.state.prepare(ctx, fetches, false, nil); err != nil {
				rn.p.state.fail(err)
				return false
			}
		}
	}
}

// topicPartition names a partition.
type topicPartition struct {
	topic     string
	partition int32
}
