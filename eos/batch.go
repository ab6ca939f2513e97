package eos

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
// produced, and the first thing that went wrong.
type batch struct {
	start     time.Time
	in, out   int
	mu        sync.Mutex
	produceAt coords // the input whose output failed first
	produce   error  // the first failed output
	// produceTopic is where the first failed output went.
	produceTopic string
	failedAt     coords // the input whose handler failed, under Stop or Retry
	failed       error
	shutdown     bool
	firsts       map[topicPartition]int64 // first offset written per output partition
	promises     promises                 // outputs whose promise has not returned
	// deadLetters holds the inputs this batch sent to the dead-letter
	// topic, with the error that sent them there.
	deadLetters map[coords]error
	// failedInputs holds the inputs whose outputs failed.
	failedInputs map[coords]bool
	// ends is, per input partition, the offset after the last input
	// handled: where the group's offset stands if the batch committed.
	ends map[topicPartition]int64
	// overBudget is set when the batch ran out of its transaction's
	// budget before its polled records were handled; next is then how
	// many records the next transaction takes.
	overBudget bool
	next       int
	first      coords // the first input handled
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

func (b *batch) failedInputCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.failedInputs)
}

func (b *batch) produceErr() (coords, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.produceAt, b.produce
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
}

func newRunner(p *Processor, cl *kgo.Client, produce func(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))) *runner {
	return &runner{p: p, produce: produce, flush: cl.Flush, stop: context.Background()}
}

// handle runs the handler on r, under hctx (ctx bounded by the
// transaction's budget), and produces its outputs (or, for a failing record
// under DeadLetter, the dead letter). It returns false when the batch must
// end without committing.
//
// Lanes may call it at once (see handleAll): what it shares with them (the
// batch, and the processor's poisoned and tooSlow maps) it touches under
// b.mu, never while the handler runs.
func (rn *runner) handle(ctx, hctx context.Context, b *batch, r *kgo.Record) bool {
	at := coordsOf(r)
	b.mu.Lock()
	if ctx.Err() != nil {
		// Shut down (past the drain): a record failed now failed for
		// that, not for its own sake, and the batch aborts.
		b.shutdown = true
		b.mu.Unlock()
		return false
	}
	if b.in > 0 && hctx.Err() != nil && ctx.Err() == nil {
		// The budget ran out before this record: the batch ends.
		b.overBudget, b.next = true, max(1, b.in/2)
		b.mu.Unlock()
		return false
	}
	b.in++
	if b.in == 1 {
		b.first = at
	}
	var err error
	var poisoned bool
	if len(rn.p.poisoned) > 0 { // hashing the topic per record costs
		err, poisoned = rn.p.poisoned[at]
	}
	b.mu.Unlock()
	var outs []*kgo.Record
	if !poisoned {
		var took time.Duration
		outs, took, err = rn.callHandler(hctx, r)
		if ctx.Err() != nil {
			// Shut down past the drain while the handler ran: it
			// failed for that, if it failed, and the batch aborts.
			b.mu.Lock()
			b.shutdown = true
			b.mu.Unlock()
			return false
		}
		if err != nil && ctx.Err() == nil && hctx.Err() != nil && errors.Is(err, hctx.Err()) {
			// The handler gave up when the budget ran out.
			b.mu.Lock()
			defer b.mu.Unlock()
			if !rn.outOfBudget(b, at, took) {
				return false
			}
			err = fmt.Errorf("%w: no result within %s, the transaction's budget, twice alone in its transaction (%v)", ErrHandlerTooSlow, rn.budget, err)
			if rn.p.cfg.onError.p.For(err).Kind == loop.PolicyDeadLetter {
				// This transaction has no time left: the dead
				// letter goes first in the next one.
				rn.p.poisoned[at] = err
				b.overBudget, b.next = true, 1
				return false
			}
			// Stop or Retry: outOfBudget found it alone in its
			// transaction, so no other lane runs.
			b.failedAt, b.failed = at, err
			return false
		}
	}
	if err != nil {
		// A poisoned input is dead-lettered whatever the policy: it was
		// poisoned under DeadLetter, or as a Retry's fallback.
		pol := rn.p.cfg.onError.p.For(err)
		if !poisoned && pol.Kind != loop.PolicyDeadLetter {
			b.mu.Lock()
			if b.failed == nil {
				b.failedAt, b.failed = at, err
			}
			b.mu.Unlock()
			return false
		}
		outs = []*kgo.Record{deadLetter(pol.DeadLetterTopic(), r, err)}
		b.mu.Lock()
		if b.deadLetters == nil {
			b.deadLetters = map[coords]error{}
		}
		b.deadLetters[at] = err
		b.mu.Unlock()
		rn.p.deadLetterLog.Log(r.Topic, r.Partition, r.Offset, err, "dead_letter_topic", pol.DeadLetterTopic())
	}
	if len(outs) > 0 {
		rn.produceAll(ctx, b, at, outs)
	}
	if rn.isolate && len(outs) > 0 {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		err := b.promises.settle(sctx, rn.flush)
		cancel()
		if _, produceErr := b.produceErr(); err != nil || produceErr != nil {
			return false // this input's outputs failed, and no later input's
		}
	}
	return true
}

// produceAll produces the outputs of the input at, with one promise for
// all of them (it knows their input, so that a failed output is traced to
// it).
func (rn *runner) produceAll(ctx context.Context, b *batch, at coords, outs []*kgo.Record) {
	b.mu.Lock()
	b.out += len(outs)
	b.mu.Unlock()
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

// outOfBudget handles a handler that gave up when its transaction's budget
// ran out after took, and reports whether the input is to blame: only when
// it was alone in its transaction, twice (once could be a passing outage
// or pause). Otherwise the batch ends (b.overBudget) with how many records
// the next transaction takes: when the handler took most of the budget,
// the records before it, so that it leads the one after; else half of
// them.
func (rn *runner) outOfBudget(b *batch, at coords, took time.Duration) bool {
	b.overBudget = true
	if b.in > 1 {
		b.next = max(1, (b.in-1)/2)
		if took > rn.budget/2 {
			b.next = b.in - 1
		}
		return false
	}
	b.next = 1
	rn.p.tooSlow[at]++
	if rn.p.tooSlow[at] < 2 {
		return false
	}
	delete(rn.p.tooSlow, at)
	b.overBudget = false
	return true
}

// callHandler runs the handler, turning a panic and an output without a
// topic into errors, so that both follow the error policy.
// It also returns how long the handler took.
func (rn *runner) callHandler(ctx context.Context, r *kgo.Record) (outs []*kgo.Record, took time.Duration, err error) {
	took, err = rn.p.obs.HandleTimed("eos", func() (err error) {
		outs, err = rn.p.handler(ctx, r)
		return err
	})
	if err != nil {
		return nil, took, err
	}
	for _, o := range outs {
		if o == nil || o.Topic == "" {
			return nil, took, errors.New("eos: handler returned an output record with no topic")
		}
	}
	return outs, took, nil
}

func deadLetter(topic string, in *kgo.Record, cause error) *kgo.Record {
	headers := append([]kgo.RecordHeader(nil), in.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: "eoskit-error", Value: []byte(cause.Error())},
		kgo.RecordHeader{Key: "eoskit-source-topic", Value: []byte(in.Topic)},
		kgo.RecordHeader{Key: "eoskit-source-partition", Value: strconv.AppendInt(nil, int64(in.Partition), 10)},
		kgo.RecordHeader{Key: "eoskit-source-offset", Value: strconv.AppendInt(nil, in.Offset, 10)},
	)
	return &kgo.Record{Topic: topic, Key: in.Key, Value: in.Value, Headers: headers}
}

// pollPerLane bounds one poll to this many records per lane (per
// [Concurrency]), so that a batch looks at its commit interval (and for a
// revocation) at least that often however many MaxRecordsPerCommit lets
// it hold, while a poll for several lanes can still span partitions.
const pollPerLane = 1000

// maxPoll is the most records one poll takes.
func (c *config) maxPoll() int { return pollPerLane * c.concurrency }

// collect handles records from first and from further polls until the batch
// is full, its interval is over, a rebalance took partitions, or a record
// failed. It reports whether every record was handled.
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
	fetches := first
	for {
		if !rn.handleAll(ctx, hctx, b, fetches) {
			return false
		}
		b.noteEnds(fetches)
		if ctx.Err() != nil {
			b.shutdown = true // past the drain: whatever failed, failed for it
			return false
		}
		remaining := time.Until(b.start.Add(cfg.commitInterval))
		if b.in >= limit || remaining <= 0 || revoked.Load() || rn.stop.Err() != nil {
			// Stopping (Run's ctx ended): commit what was handled,
			// every polled record included, while the drain lasts.
			return true
		}
		pollCtx, cancel := context.WithTimeout(rn.stop, remaining)
		fetches = poll(pollCtx, min(limit-b.in, rn.p.cfg.maxPoll()))
		rn.p.obs.Fetched(fetches)
		cancel()
		if ctx.Err() != nil {
			b.shutdown = true
			return false
		}
		loop.LogFetchErrors(fetches, rn.p.logger)
	}
}
