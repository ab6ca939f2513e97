package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/loop"
)

// HandlerFunc turns one input record into zero or more output records. The
// processor owns producing and committing, which is what lets it put the
// outputs and the input's offset in one transaction; the handler only
// returns records, each naming its Topic (and, if it matters, Key or
// Partition). It must not keep in or its fields after it returns.
//
// A handler may be called more than once for the same input: when a
// transaction aborts (rebalance, failure, crash of a previous owner) the
// input is read again. Only the outputs of the committed attempt are visible
// to read_committed readers, so a handler whose only effect is its return
// value is exactly-once. Side effects outside Kafka (a call to another
// service, a database write) are not covered: see offsetstore and dedup.
type HandlerFunc func(ctx context.Context, in *kgo.Record) (out []*kgo.Record, err error)

// Processor is a consume-transform-produce loop. Under ExactlyOnce (the
// default) it is built on franz-go's GroupTransactSession: the outputs of
// every input record and the input's consumed offset are committed in one
// Kafka transaction, so that after any crash, rebalance or fencing each
// input's outputs are visible to read_committed readers exactly once, in
// input order per input partition.
type Processor struct {
	cfg     *config
	handler HandlerFunc
	logger  *slog.Logger
	// obs takes what the processor reports: its metrics and its health.
	obs *loop.Observer
	// userHooks are the partition callbacks given in ClientOptions, run
	// after the processor's own.
	userHooks loop.UserHooks
	running   atomic.Bool
	// committed counts commits, so that Run can tell a session that made
	// progress from one that failed at once.
	committed atomic.Int64
	// refused turns the refusals the polls report, once they last, into
	// an *[eoskit.AuthorizationError] (one Watch per Run).
	refused *authz.Watch
	// hangs is what the hanging-transaction check remembers across
	// sessions.
	hangs txnHistory
	// deadLetterFailures counts, per input, the dead letters that could
	// not be written since it last committed, across sessions; only Run's
	// goroutine uses it.
	deadLetterFailures map[coords]int
	// perTxn bounds the records of one transaction: MaxRecordsPerCommit,
	// lowered after a transaction ran out of its budget and raised again
	// while transactions end well within it. tooSlow counts, per input,
	// the transactions that ran out of budget with it alone in its
	// handler. poisoned holds the inputs to dead-letter without running
	// the handler (their outputs could not be written, or their handler
	// was too slow) until a transaction holding their dead letter
	// commits. Only Run's goroutine uses them, across sessions.
	perTxn   int
	tooSlow  map[coords]int
	poisoned map[coords]error
	// deadLetterLog logs the inputs dead-lettered, at most one line a
	// second.
	deadLetterLog *loop.DeadLetterLog
	// attempts counts, per input, the attempts of the Retry policy so
	// far, until the input commits or its fallback applies.
	attempts map[coords]int
}

// NewProcessor returns a processor that runs handler. Required options:
// [Brokers], [Group], [Topics], and, for ExactlyOnce, [TransactionalID].
// Optional: [WithSemantics], [CommitInterval], [MaxRecordsPerCommit],
// [OnHandlerError], [Concurrency], [HangingTransactionCheck], [Logger], [WithMetrics],
// [ClientOptions].
func NewProcessor(handler HandlerFunc, opts ...ProcessorOption) (*Processor, error) {
	c := newConfig(opts)
	if err := c.validateProcessor(handler); err != nil {
		return nil, err
	}
	var preset []kgo.Opt
	if c.semantics.valid() {
		preset = append(c.semantics.ProducerOptions(), c.semantics.ConsumerOptions()...)
	}
	userHooks, err := loop.ReadUserOptions(preset, c.clientOpts, map[string]string{
		"ConsumerGroup": "use eos.Group", "ConsumeTopics": "use eos.Topics", "ConsumeRegex": "name the topics with eos.Topics",
		"ConsumePartitions": "a processor consumes in its group (eos.Group)", "TransactionalID": "use eos.TransactionalID",
		"AdjustFetchOffsetsFn": "a processor starts from its group's committed offsets"})
	if err != nil {
		return nil, &eoskit.ConfigError{Package: "eos", Setting: "ClientOptions", Semantics: checkedAgainst(c.semantics), Reason: err.Error(), Err: err}
	}
	// Build (and close) a client once, so that a pass-through option that
	// contradicts the semantics fails here rather than in Run.
	cl, err := newClient(c, RoleProducer, RoleConsumer)
	if err != nil {
		return nil, err
	}
	txnTimeout := transactionTimeout(cl)
	cl.Close()
	if c.semantics == ExactlyOnce && c.commitInterval > txnTimeout/2 {
		return nil, &eoskit.ConfigError{Package: "eos", Setting: "CommitInterval", Semantics: checkedAgainst(c.semantics), Reason: fmt.Sprintf(
			"%s is not well below the transaction timeout (%s): keep it at most half of it, or the broker aborts transactions under the processor", c.commitInterval, txnTimeout)}
	}
	logger := c.logger.With("group", c.group, "semantics", c.semantics.String())
	if c.txnID != "" {
		logger = logger.With("transactional_id", c.txnID)
	}
	return &Processor{cfg: c, handler: handler, logger: logger, userHooks: userHooks, obs: loop.NewObserver("eos", c.group, c.metrics), deadLetterFailures: map[coords]int{},
		perTxn: c.maxRecords, tooSlow: map[coords]int{}, poisoned: map[coords]error{}, attempts: map[coords]int{},
		deadLetterLog: loop.NewDeadLetterLog(logger, "eos: handler failed; sending input to dead-letter topic", loop.DeadLetterLogEvery)}, nil
}

func (c *config) validateProcessor(handler HandlerFunc) error {
	fail := func(setting, reason string) error {
		return &eoskit.ConfigError{Package: "eos", Setting: setting, Semantics: checkedAgainst(c.semantics), Reason: reason}
	}
	switch {
	case handler == nil:
		return fail("handler", "must not be nil")
	case !c.semantics.valid():
		return &eoskit.ConfigError{Package: "eos", Setting: "WithSemantics", Reason: fmt.Sprintf("unknown value %d", int8(c.semantics))}
	case c.group == "":
		return fail("Group", "a processor consumes in a consumer group; name one")
	case len(c.inputTopics) == 0:
		return fail("Topics", "name at least one topic to consume")
	case c.semantics == ExactlyOnce && c.txnID == "":
		return fail("TransactionalID", "exactly-once needs a stable transactional id per instance (see StableTransactionalID)")
	case c.semantics != ExactlyOnce && c.txnID != "":
		return fail("TransactionalID", "only exactly-once commits in transactions; this semantics would ignore it")
	case c.commitInterval <= 0:
		return fail("CommitInterval", "must be positive")
	case c.maxRecords <= 0:
		return fail("MaxRecordsPerCommit", "must be positive")
	case c.concurrency < 1:
		return fail("Concurrency", "must be at least 1")
	case c.drain < 0:
		return fail("DrainTimeout", "must not be negative (0 aborts at once)")
	case c.order != PartitionOrder && c.order != KeyOrder:
		return fail("Concurrency", fmt.Sprintf("unknown order %d", c.order))
	case c.hangCheck < 0:
		return fail("HangingTransactionCheck", "must not be negative (0 turns the check off)")
	case c.semantics != ExactlyOnce && c.hangCheckSet:
		return fail("HangingTransactionCheck", "only exactly-once commits offsets in transactions; this semantics has none to hang")
	case c.semantics != ExactlyOnce && c.onHangSet:
		return fail("OnHangingTransaction", "only exactly-once commits offsets in transactions; this semantics has none to hang")
	case c.hangCheck == 0 && c.onHangSet:
		return fail("OnHangingTransaction", "the hanging-transaction check is off (HangingTransactionCheck(0)): nothing would apply the policy")
	case c.onError.p.Validate() != nil:
		return fail("OnHandlerError", c.onError.p.Validate().Error())
	case slices.Contains(c.onError.p.DeadLetterTopics(), ""):
		return fail("OnHandlerError", "DeadLetter needs a topic")
	}
	for _, t := range c.inputTopics {
		if slices.Contains(c.onError.p.DeadLetterTopics(), t) {
			return fail("OnHandlerError", "the dead-letter topic "+t+" is also an input topic")
		}
	}
	return c.requireBrokers()
}

// Run consumes, transforms and produces until ctx is done or a final error
// occurs. On ctx's end it drains ([DrainTimeout], default 10s): it stops
// polling, handles every record already polled into the open transaction,
// commits them all with their offsets, leaves the group and returns nil.
// The drain is all or nothing over what was polled: when the timeout
// passes first (or DrainTimeout is 0), it cancels the handlers' ctx and
// aborts the whole transaction, whose inputs are read again by whoever
// takes the partitions.
//
// It returns an error wrapping [ErrFenced] when a newer instance with the
// same transactional id took over, a *[eoskit.RecordError] under the [Stop] policy
// (or once a [Retry]'s attempts ran out), a *DeadLetterError when a dead
// letter cannot be written, a *HangingTransactionError under
// [StopWhenHanging], a *[eoskit.ConfigError] when the cluster refuses
// [RepairHangingTransactions] or lacks the dead-letter topic (checked
// when Run starts, and when a dead letter finds it deleted), and other errors only when the client fails
// repeatedly. A Processor runs once at a time ([eoskit.ErrRunning] otherwise); to
// restart, call Run again.
func (p *Processor) Run(ctx context.Context) (err error) {
	if !p.running.CompareAndSwap(false, true) {
		return eoskit.ErrRunning
	}
	defer p.running.Store(false)
	p.obs.Running(true, nil)
	defer func() { p.obs.Running(false, err) }()
	defer p.deadLetterLog.Flush()
	// ctx's end stops polling; work, which everything else runs under
	// (handlers, producing, committing), ends DrainTimeout later.
	work, done := loop.Drained(ctx, p.cfg.drain)
	defer done()
	p.refused = &authz.Watch{Group: p.cfg.group, Grace: authz.DefaultGrace}
	if err := p.checkDeadLetterTopic(ctx); err != nil {
		return err
	}

	failures := 0
	for {
		committedBefore := p.committed.Load()
		var err error
		if p.cfg.semantics == ExactlyOnce {
			err = p.runTransactional(work, ctx)
		} else {
			err = p.runPlain(work, ctx)
		}
		var restart *restartError
		if !errors.As(err, &restart) {
			return err
		}
		p.obs.Failed(restart.err)
		// An end whose outcome is unknown leaves the client's view of the
		// committed offsets uncertain; a new session re-reads them from the
		// broker and re-registers the transactional id, which bumps the
		// epoch and aborts anything left open.
		// Only restarts in a row count: a session that committed
		// something was healthy, and the next failure starts over.
		if p.committed.Load() > committedBefore {
			failures = 0
		}
		failures++
		if failures > maxSessionRestarts {
			return fmt.Errorf("eos: giving up after %d session restarts in a row: %w", maxSessionRestarts, restart.err)
		}
		backoff := min(time.Second<<(failures-1), 30*time.Second)
		p.logger.Warn("eos: restarting session", "err", restart.err, "attempt", failures, "backoff", backoff)
		if !loop.Sleep(ctx, backoff) {
			return nil
		}
	}
}

// maxSessionRestarts bounds the restarts in a row, without a commit in
// between, before Run gives up. Each new session first retries its
// producer id for up to claimPatience, so with the doubling backoff between
// sessions (1 s up to 30 s) this rides out over ten minutes of broker
// outage.
const maxSessionRestarts = 10

// claimPatience is how long a new session retries registering its
// transactional id before it gives up and restarts: longer than a broker
// restart, so that a bounce costs no more than the bounce itself.
const claimPatience = time.Minute

// claimTransactionalID initialises cl's producer id, retrying in place
// (100 ms doubling to 1 s) while the broker cannot answer. It returns nil
// once registered or when ctx ends; ErrFenced when a newer instance holds
// the id; a *restartError after claimPatience.
func (p *Processor) claimTransactionalID(ctx context.Context, cl *kgo.Client) error {
	deadline := time.Now().Add(claimPatience)
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		_, _, err := cl.ProducerID(ctx)
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case authz.Refused(err):
			return authz.Write("", p.cfg.txnID, p.cfg.group, err)
		case isFenced(err):
			p.obs.Fenced()
			return fencedError("init producer id", err)
		case time.Now().After(deadline):
			return &restartError{fmt.Errorf("init producer id: %w", err)}
		}
		p.logger.Warn("eos: registering the transactional id failed; retrying", "err", err, "backoff", backoff)
		if !loop.Sleep(ctx, backoff) {
			return nil
		}
	}
}

// Health returns what the processor shows probes and dashboards: see
// [eoskit.Health]. Safe to call at any time, from any goroutine.
func (p *Processor) Health() eoskit.Health { return p.obs.Health() }

// restartError asks Run to start over with a new client.
type restartError struct{ err error }

func (e *restartError) Error() string { return "eos: session must restart: " + e.err.Error() }

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

// handleAll handles the records of one poll: one at a time in poll order,
// or, under [Concurrency] above 1, in lanes that run at once, up to the
// bound: a lane per input partition (PartitionOrder) or per group of keys
// within a partition (KeyOrder), each handling its records in offset order
// and producing each one's outputs before it handles the next, so that
// outputs keep their inputs' order per partition (per key). A batch
// isolating a failure runs one at a time. It reports whether every record
// was handled; once one lane fails, the others stop at their next record.
func (rn *runner) handleAll(ctx, hctx context.Context, b *batch, fetches kgo.Fetches) bool {
	n := rn.p.cfg.concurrency
	if n <= 1 || rn.isolate {
		ok := true
		fetches.EachRecord(func(r *kgo.Record) {
			ok = ok && rn.handle(ctx, hctx, b, r)
		})
		return ok
	}
	lanes := laneRecords(fetches, n, rn.p.cfg.order)
	var failed atomic.Bool
	var wg sync.WaitGroup
	slots := make(chan struct{}, n)
	for _, lane := range lanes {
		slots <- struct{}{}
		if failed.Load() {
			<-slots
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			for _, r := range lane {
				if failed.Load() || !rn.handle(ctx, hctx, b, r) {
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	return !failed.Load()
}

// laneRecords splits a poll's records into lanes that may run at once: one
// per partition, or, under KeyOrder, up to n per partition by a hash of the
// key (records without a key share one), each in offset order.
func laneRecords(fetches kgo.Fetches, n int, order Order) [][]*kgo.Record {
	var lanes [][]*kgo.Record
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		if order != KeyOrder {
			lanes = append(lanes, p.Records)
			return
		}
		byKey := make([][]*kgo.Record, n)
		for _, r := range p.Records {
			i := 0
			if r.Key != nil {
				i = int(fnv32a(r.Key) % uint32(n))
			}
			byKey[i] = append(byKey[i], r)
		}
		for _, l := range byKey {
			if len(l) > 0 {
				lanes = append(lanes, l)
			}
		}
	})
	return lanes
}

// fnv32a is FNV-1a over b, without hash/fnv's allocation per record.
func fnv32a(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	return h
}

// groupHooks returns options that record revocations: a batch stops early
// once the group took partitions, since it can no longer commit. Under the
// cooperative-sticky balancer (franz-go's default) every group session
// ends with a revoke of nothing: that takes nothing, and the batch goes on
// (franz-go's GroupTransactSession lets its commit through too), with the
// guard against an unknown commit outcome in force.
func (p *Processor) groupHooks(revoked *atomic.Bool) []kgo.Opt {
	onTaken := func(what string) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			if len(parts) == 0 {
				p.logger.Debug("eos: group session ended; no partition " + what)
				return
			}
			revoked.Store(true)
			if what == "lost" {
				p.obs.Lost(parts)
			} else {
				p.obs.Revoked(parts)
			}
			p.logger.Info("eos: partitions "+what, "partitions", parts)
		}
	}
	return []kgo.Opt{
		kgo.OnPartitionsAssigned(loop.Chain(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			p.obs.Assigned(parts)
			p.logger.Info("eos: partitions assigned", "partitions", parts)
		}, p.userHooks.Assigned)),
		kgo.OnPartitionsRevoked(loop.Chain(onTaken("revoked"), p.userHooks.Revoked)),
		kgo.OnPartitionsLost(loop.Chain(onTaken("lost"), p.userHooks.Lost)),
	}
}

// afterFailure applies the error policy once a batch ended without a
// commit. It returns a non-nil error when Run must return it.
func (p *Processor) afterFailure(ctx context.Context, rn *runner, b *batch) error {
	// The inputs the batch dead-lettered are dead-lettered again when it
	// is read again, without their handlers: a record whose error the
	// policy dead-letters is handled once, whatever else aborted its
	// transaction.
	for at, cause := range b.deadLetters {
		p.poisoned[at] = cause
	}
	at, err := b.failedAt, b.failed
	if err == nil {
		at, err = b.produceErr()
		if err == nil {
			return nil
		}
		// No ACL to write the output (or the dead letter) is no
		// record's fault, and waiting will not grant it.
		if authz.Refused(err) {
			b.mu.Lock()
			topic := b.produceTopic
			b.mu.Unlock()
			return authz.Write(topic, p.cfg.txnID, p.cfg.group, err)
		}
		if recordSpecific(err) && b.failedInputCount() > 1 && !rn.isolate {
			// The outputs (or dead letters) of several inputs failed
			// alike: a produce batch the broker refused whole (a topic
			// whose max.message.bytes is below the producer's batch
			// size, say) fails every record in it, and the first is not
			// to blame. Read the batch again settling each input's
			// outputs alone.
			rn.isolate = true
			p.logger.Warn("eos: the outputs of several inputs failed alike; reading the batch again one input at a time to find whose fault it is", "err", err)
			return nil
		}
		if cause, ok := b.deadLetters[at]; ok {
			return p.deadLetterFailed(ctx, rn, at, cause, err)
		}
		// An output that failed for its own sake (too large, invalid) is
		// the input's failure too: the input follows the policy, so a
		// record that can never be written does not loop forever. Any
		// other produce failure (a missing topic, a refused ACL, a
		// delivery timeout) fails every record alike and is no record's
		// fault: the session restarts with backoff.
		if !recordSpecific(err) {
			return &restartError{fmt.Errorf("produce failed, not because of the input %s[%d]@%d: %w", at.topic, at.partition, at.offset, err)}
		}
	}
	return p.applyPolicy(ctx, at, err)
}

// retryLimit caps the pauses of the Retry policy (unless its backoff is
// larger).
const retryLimit = 30 * time.Second

// applyPolicy applies the error policy to the input at, whose handler (or
// output) failed with err, in a batch that was aborted: Retry pauses and
// lets the batch be read again, until its attempts run out and its
// fallback applies; DeadLetter poisons the input, so that the next
// transaction dead-letters it without running its handler; Stop returns a
// *[eoskit.RecordError].
func (p *Processor) applyPolicy(ctx context.Context, at coords, err error) error {
	pol := p.cfg.onError.p.For(err)
	p.attempts[at]++ // across the rules, should the input's error change
	attempts := p.attempts[at]
	if pol.Kind == loop.PolicyRetry {
		if !pol.Final(attempts) {
			backoff := loop.Backoff(attempts, pol.Backoff, retryLimit)
			p.logger.Warn("eos: handler failed; retrying", "topic", at.topic, "partition", at.partition, "offset", at.offset,
				"err", loop.ErrorText(err), "attempt", attempts, "backoff", backoff)
			loop.Sleep(ctx, backoff)
			return nil
		}
		pol = pol.Fallback()
	}
	delete(p.attempts, at)
	if pol.Kind == loop.PolicyDeadLetter {
		p.poisoned[at] = err
		return nil
	}
	return &eoskit.RecordError{Topic: at.topic, Partition: at.partition, Offset: at.offset, Attempts: attempts, Err: err}
}

// maxDeadLetterAttempts bounds how often one input's dead letter is tried
// before Run gives up with a *DeadLetterError.
const maxDeadLetterAttempts = 4

// deadLetterFailed handles a dead letter that could not be written (too
// large with the headers added, a missing dead-letter topic, no write ACL
// on it): it tries again after a growing backoff, a few times, then returns
// a *DeadLetterError naming the input and both errors. The input's offset
// is not committed: it is read again when the processor next starts.
func (p *Processor) deadLetterFailed(ctx context.Context, rn *runner, at coords, cause, err error) error {
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		// The topic was there when Run started. Deleted since (a fresh
		// look confirms it), no retry mends it; the input's offset is
		// not committed.
		if cerr := p.checkDeadLetterTopic(ctx); cerr != nil {
			return cerr // naming the topic found missing (with several rules, not always this input's)
		}
	}
	p.deadLetterFailures[at]++
	attempts := p.deadLetterFailures[at]
	if attempts >= maxDeadLetterAttempts {
		delete(p.deadLetterFailures, at)
		return &DeadLetterError{Topic: at.topic, Partition: at.partition, Offset: at.offset,
			DeadLetterTopic: p.cfg.onError.p.For(cause).DeadLetterTopic(), Attempts: attempts, Cause: cause, Err: err}
	}
	backoff := time.Second << (attempts - 1)
	p.logger.Warn("eos: writing a dead letter failed; retrying", "topic", at.topic, "partition", at.partition, "offset", at.offset,
		"dead_letter_topic", p.cfg.onError.p.For(cause).DeadLetterTopic(), "err", err, "attempt", attempts, "backoff", backoff)
	p.poisoned[at] = cause
	loop.Sleep(ctx, backoff)
	return nil
}

// transactionBudget is how long a transaction may spend handling records:
// three quarters of the transaction timeout, leaving the rest to flush and
// end it before the broker aborts it.
func transactionBudget(txnTimeout time.Duration) time.Duration { return txnTimeout * 3 / 4 }

// transactionTimeout is the client's transaction timeout (franz-go's
// default, 40 s, unless kgo.TransactionTimeout set it).
func transactionTimeout(cl *kgo.Client) time.Duration {
	d, _ := cl.OptValue(kgo.TransactionTimeout).(time.Duration)
	return d
}

// forgetDeadLetters clears the failure counts of the dead letters a
// committed batch wrote, and the retry counts of the inputs it committed.
func (p *Processor) forgetDeadLetters(b *batch) {
	for at := range b.deadLetters {
		delete(p.deadLetterFailures, at)
		delete(p.poisoned, at)
	}
	delete(p.tooSlow, b.first)
	for at := range p.attempts {
		if end, ok := b.ends[topicPartition{at.topic, at.partition}]; ok && at.offset < end {
			delete(p.attempts, at)
		}
	}
}

// recordSpecific reports whether a produce error is the record's own fault,
// so that the input that made it may be blamed.
func recordSpecific(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || errors.Is(err, kerr.CorruptMessage) || errors.Is(err, kerr.InvalidTimestamp)
}

// hangConfig returns what each session's hanging-transaction check is
// built from.
func (p *Processor) hangConfig() hangConfig {
	return hangConfig{interval: p.cfg.hangCheck, policy: p.cfg.onHang, group: p.cfg.group, txnID: p.cfg.txnID,
		clientOpts: p.cfg.clientOpts, brokers: p.cfg.brokers, logger: p.logger, metrics: hangMetrics{p.obs.Metrics},
		history: &p.hangs, committed: func() bool { return p.committed.Load() > 0 }}
}

// runTransactional is one GroupTransactSession's life: it returns when ctx
// ends, on a final error, or with a *restartError.
func (p *Processor) runTransactional(ctx, stop context.Context) error {
	var revoked atomic.Bool
	opts := append(p.cfg.kgoOpts(RoleProducer, RoleConsumer), p.groupHooks(&revoked)...)
	// disconnected tells the hanging-transaction check that a broker
	// connection closed.
	var disconnected disconnectFlag
	opts = append(opts, kgo.WithHooks(&disconnected))
	p.obs.NewSession() // before the group can assign anything to it
	sess, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return &eoskit.ConfigError{Package: "eos", Setting: "ClientOptions", Semantics: checkedAgainst(p.cfg.semantics), Reason: err.Error(), Err: err}
	}
	// Close leaves the group; by then no transaction is open, because every
	// path below ends the one it began.
	defer sess.Close()
	p.obs.WatchAssignment(p.logger, loop.SessionTimeout(sess.Client()))

	check, err := newHangingCheck(ctx, p.hangConfig(), sess.Client(), &disconnected)
	if err != nil {
		return err
	}
	check.beforeClaim(ctx)
	poll := check.poll(sess.PollRecords)
	// Before registering the transactional id, which bumps the epoch and
	// with it the coordinator's record of how the hanging transaction
	// ended: stopping or waiting changes nothing.
	if err := check.hold(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	// Claim the transactional id before consuming, as Kafka Streams'
	// initTransactions does. A predecessor with this id (this process's
	// previous session, or a process that died) may have left a
	// transaction open whose abort never reached the broker; while it is
	// open, its pending offset commits make the group's offset fetch
	// answer UNSTABLE_OFFSET_COMMIT, so this session gets no records, and
	// franz-go initialises the producer id only on a first produce: the
	// partitions would stall until the broker times the transaction out.
	// InitProducerID bumps the epoch, which aborts that transaction now
	// and fences its owner.
	if err := p.claimTransactionalID(ctx, sess.Client()); err != nil || ctx.Err() != nil {
		return err
	}
	stopSweeps := check.start(ctx)
	// Runs before the deferred Close: the check uses the session's client.
	defer stopSweeps()

	rn := newRunner(p, sess.Client(), sess.Produce)
	rn.stop = stop
	adm := kadm.NewClient(sess.Client())
	txnTimeout := transactionTimeout(sess.Client())
	rn.budget = transactionBudget(txnTimeout)
	for {
		if err := check.hold(ctx); err != nil || ctx.Err() != nil {
			return err
		}
		fetches, stopped, err := loop.Poll(stop, poll, min(p.perTxn, p.cfg.maxPoll()), p.logger, p.refused)
		p.obs.Fetched(fetches)
		if stopped {
			return nil
		}
		if err != nil {
			return pollError(err)
		}
		if fetches.NumRecords() == 0 {
			continue
		}

		// After a broker went away, this transaction could join a
		// hanging one: the check looks first.
		check.afterDisconnect(ctx)
		if err := check.hold(ctx); err != nil || ctx.Err() != nil {
			// The polled records are read again by whoever runs next:
			// no transaction took them.
			return err
		}
		if err := sess.Begin(); err != nil {
			if authz.Refused(err) {
				return authz.Write("", p.cfg.txnID, p.cfg.group, err)
			}
			if isFenced(err) {
				p.obs.Fenced()
				return fencedError("begin transaction", err)
			}
			return &restartError{fmt.Errorf("begin transaction: %w", err)}
		}
		// The epoch names this transaction for the hanging-transaction
		// check, which must know how it ended.
		producerID, txnEpoch, idErr := sess.Client().ProducerID(ctx)
		b := &batch{start: time.Now()}
		handled := rn.collect(ctx, b, fetches, sess.PollRecords, &revoked)

		// Flush and settle every output before deciding: End commits
		// whatever was acknowledged, so a failed output must turn the
		// commit into an abort here.
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), endTimeout)
		flushErr := b.promises.settle(endCtx, rn.flush)
		_, produceErr := b.produceErr()
		wantCommit := handled && flushErr == nil && produceErr == nil && ctx.Err() == nil
		committed, endErr := sess.End(endCtx, kgo.TransactionEndTry(wantCommit))
		cancel()
		if idErr == nil {
			b.mu.Lock()
			rec := txnRecord{firsts: b.firsts}
			b.mu.Unlock()
			switch {
			case !wantCommit:
				rec.known = true // never asked to commit: it aborts
			case committed:
				rec.committed, rec.known = true, true
			}
			// A wanted commit that ended not committed may have
			// committed at the broker (see below): its outcome stays
			// unknown.
			check.ended(producerID, txnEpoch, rec)
		}
		sawRevoke := revoked.Swap(false)
		elapsed := time.Since(b.start)
		// Whatever failed once ctx ended (a handler, a record produced
		// under ctx) failed because of it: a shutdown, not an error.
		b.shutdown = b.shutdown || ctx.Err() != nil

		switch {
		case authz.Refused(endErr):
			// The transactional id (EndTxn, AddOffsetsToTxn) or the
			// group (TxnOffsetCommit) refused. franz-go's abort is
			// refused too: the broker aborts the transaction at its
			// timeout, and until then read_committed readers of its
			// partitions wait.
			p.obs.Aborted("refused", elapsed)
			return authz.Write("", p.cfg.txnID, p.cfg.group, endErr)
		case (isFenced(endErr) || isFenced(produceErr) || isFenced(flushErr)) && elapsed >= txnTimeout &&
			idErr == nil && coordinatorTimedOut(ctx, adm, p.cfg.txnID, producerID, txnEpoch):
			// The transaction outlived its timeout: the coordinator
			// aborted it and bumped the epoch, which is what the epoch
			// error says, and nobody registered the id since (a zombie
			// woken past its timeout after its successor started is
			// fenced, below: restarting would fence the successor). A
			// new session registers the transactional id again and
			// goes on.
			p.obs.Aborted("timeout", elapsed)
			p.perTxn = max(1, b.in/2) // kept by the next session
			p.logger.Warn("eos: the transaction outlived its timeout and the broker aborted it; restarting the session (keep CommitInterval and handler time well below TransactionTimeout)",
				"elapsed", elapsed, "transaction_timeout", txnTimeout, "records_in", b.in)
			return &restartError{fmt.Errorf("transaction outlived its timeout (%s > %s): %w", elapsed.Round(time.Millisecond), txnTimeout, errors.Join(endErr, produceErr, flushErr))}
		case isFenced(endErr) || isFenced(produceErr) || isFenced(flushErr):
			p.obs.Fenced()
			p.obs.Aborted("fenced", elapsed)
			p.logger.Warn("eos: fenced by a newer instance with the same transactional id; stopping")
			return fencedError("end transaction", errors.Join(endErr, produceErr, flushErr))
		case endErr != nil || flushErr != nil:
			p.obs.Aborted("outcome-unknown", elapsed)
			return &restartError{fmt.Errorf("end transaction: %w", errors.Join(endErr, flushErr))}
		case committed:
			p.committed.Add(1)
			p.obs.Committed(b.in, b.out, elapsed)
			p.obs.DeadLettered(len(b.deadLetters))
			p.forgetDeadLetters(b)
			rn.isolate = false
			if b.in >= p.perTxn && p.perTxn < p.cfg.maxRecords {
				switch {
				case elapsed < rn.budget/8:
					p.perTxn = min(2*p.perTxn, p.cfg.maxRecords)
				case elapsed < rn.budget/2:
					p.perTxn = min(p.perTxn+max(1, p.perTxn/4), p.cfg.maxRecords)
				}
			}
			continue
		case wantCommit && !b.shutdown && !sawRevoke && !p.knownAbort(ctx, sess.Client(), b):
			// A commit was asked for and ended as not committed, with
			// no partition taken, and the broker's committed offsets
			// do not show it aborted: franz-go retried a failed EndTxn
			// (UNKNOWN_SERVER_ERROR, say) as an abort, and the broker
			// may have committed. This session's view of the committed
			// offsets (franz-go's) may be older than the broker's:
			// going on would copy a committed batch again. A new
			// session reads the offsets from the broker.
			p.obs.Aborted("outcome-unknown", elapsed)
			p.logger.Warn("eos: a commit ended unconfirmed with no rebalance; its outcome is unknown, restarting the session to read the committed offsets from the broker", "records_in", b.in)
			return &restartError{errors.New("commit not confirmed and no partition revoked: outcome unknown")}
		}

		reason := "rebalance"
		switch {
		case b.shutdown:
			reason = "shutdown"
		case b.failed != nil:
			reason = "handler-error"
		case produceErr != nil:
			reason = "produce-error"
		case b.overBudget:
			reason = "budget"
		}
		p.obs.Aborted(reason, elapsed)
		p.logger.Info("eos: transaction aborted; its inputs will be read again", "reason", reason, "records_in", b.in)
		if b.shutdown {
			return nil
		}
		if b.overBudget {
			p.perTxn = b.next
			p.logger.Warn("eos: handlers ran out of the transaction's budget before the polled records were handled; ended the transaction early and taking fewer records per transaction",
				"budget", rn.budget, "records_in", b.in, "records_per_transaction", p.perTxn)
		}
		if wantCommit {
			continue // a rebalance: the records come back to whoever owns them now
		}
		if err := p.afterFailure(ctx, rn, b); err != nil {
			return err
		}
	}
}
