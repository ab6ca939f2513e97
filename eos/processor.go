package eos

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/hanging"
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
	// state is the keyed state (nil: stateless; see Changelog).
	state *keyedState
	// handlerState is what each handler call's context carries beside its
	// keyed state (see withKV).
	handlerState handlerState
	// stops end what start began for the Run (the global tables'
	// refresh, the co-partitioned tables' fetching, the standbys'
	// catch-ups), in reverse order, when Run returns; Run's goroutine
	// alone uses it.
	stops []func()
	// wake ends an idle poll when the group's callbacks leave the loop
	// something to do; rearm is set by a revoke (or loss) since the
	// session's last End, which an idle session makes (session.rearm).
	wake  *idleWake
	rearm atomic.Bool
	// userHooks are the partition callbacks given in ClientOptions, run
	// after the processor's own.
	userHooks loop.Hooks
	shell     loop.Shell
	// committed counts commits, so that Run can tell a session that made
	// progress from one that failed at once.
	committed atomic.Int64
	// refused turns the refusals the polls report, once they last, into
	// an *[eoskit.AuthorizationError] (one Watch per Run).
	refused *authz.Watch
	// hangs is what the hanging-transaction check remembers across
	// sessions.
	hangs hanging.History
	// perTxn bounds the records of one transaction: MaxRecordsPerCommit,
	// lowered after a transaction ran out of its budget and raised again
	// while transactions end well within it. Only Run's goroutine uses
	// it, across sessions.
	perTxn int
	// failures is what the processor remembers about failed inputs
	// across transactions and sessions.
	failures *failures
	// deadLetterLog logs the inputs dead-lettered, at most one line a
	// second.
	deadLetterLog *loop.DeadLetterLog
}

// NewProcessor returns a processor that runs handler. Required options:
// [Brokers], [Group], [Topics], and, for ExactlyOnce, [TransactionalID].
// Optional: [WithSemantics], [CommitInterval], [MaxRecordsPerCommit],
// [OnHandlerError], [Concurrency], [HangingTransactionCheck], [Logger], [WithMetrics],
// [ClientOptions].
func NewProcessor(handler HandlerFunc, opts ...ProcessorOption) (*Processor, error) {
	return newProcessor(newConfig(opts), handler)
}

// newProcessor is NewProcessor of c, a config no other processor holds.
func newProcessor(c *config, handler HandlerFunc) (*Processor, error) {
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
		"AdjustFetchOffsetsFn": "a processor starts from its group's committed offsets",
		// The exactly-once loop never calls AllowRebalance: every
		// rebalance would wait for the rebalance timeout, then lose the
		// member's partitions.
		"BlockRebalanceOnPoll": "a processor decides itself when a rebalance may proceed"})
	if err != nil {
		return nil, c.clientOptionsError(err)
	}
	// Build (and close) a client once, so that a pass-through option that
	// contradicts the semantics fails here rather than in Run. It
	// consumes no topic, so that it never starts to join the group: a
	// join, however brief, would rebalance the group's running members
	// and call the caller's partition callbacks.
	check := *c
	check.inputTopics = nil
	cl, err := newClient(&check, RoleProducer, RoleConsumer)
	if err != nil {
		return nil, err
	}
	txnTimeout := transactionTimeout(cl)
	userClientID, _ := cl.OptValue(kgo.ClientID).(string)
	advertise, err := endpointOpts(c, userClientID)
	if err != nil {
		cl.Close()
		return nil, err
	}
	c.clientOpts = append(slices.Clip(c.clientOpts), advertise...)
	if c.state != nil && c.state.standbys > 0 && !c.consumerProtocol && defaultBalancer(cl) {
		c.state.warm = &atomic.Pointer[[]int32]{}
		c.clientOpts = append(c.clientOpts, kgo.Balancers(&standbyBalancer{warm: c.state.warm, standbys: c.state.standbys}, kgo.CooperativeStickyBalancer()))
	}
	if c.state != nil {
		c.state.others, _ = cl.OptValue(kgo.RecordPartitioner).(kgo.Partitioner)
		if c.state.others == nil {
			c.state.others = kgo.UniformBytesPartitioner(64<<10, true, true, nil) // franz-go's default
		}
		c.state.batchMax, _ = cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
		if c.state.batchMax != nil {
			c.state.limits = newBatchLimits(c.state.batchMax)
		}
		c.state.requestMax = produceRequestMax(cl)
		if len(advertise) > 0 && c.state.requestMax > 0 {
			// The running client's id is the endpoint's, longer than
			// the one the check client measured.
			c.state.requestMax -= len(endpointPrefix+c.endpoint) - len(userClientID)
		}
	}
	cl.Close()
	if c.state != nil {
		floor := txnTimeout + restoreMargin
		switch {
		case !c.state.restoreSet:
			c.state.restoreTimeout = max(c.state.restoreTimeout, floor)
		case c.state.restoreTimeout < floor:
			return nil, &eoskit.ConfigError{Package: "eos", Setting: "RestoreTimeout", Semantics: checkedAgainst(c.semantics), Reason: fmt.Sprintf(
				"%s is below the transaction timeout (%s) plus %s: a transaction a dead owner left open on the changelog holds a restore without progress until the broker aborts it", c.state.restoreTimeout, txnTimeout, restoreMargin)}
		}
	}
	if c.semantics == ExactlyOnce && c.commitInterval > txnTimeout/2 {
		return nil, &eoskit.ConfigError{Package: "eos", Setting: "CommitInterval", Semantics: checkedAgainst(c.semantics), Reason: fmt.Sprintf(
			"%s is not well below the transaction timeout (%s): keep it at most half of it, or the broker aborts transactions under the processor", c.commitInterval, txnTimeout)}
	}
	logger := c.logger.With("group", c.group, "semantics", c.semantics.String())
	if c.txnID != "" {
		logger = logger.With("transactional_id", c.txnID)
	}
	p := &Processor{cfg: c, handler: handler, logger: logger, userHooks: userHooks, obs: loop.NewObserver("eos", c.group, c.metrics),
		perTxn: c.maxRecords, failures: newFailures(), wake: newIdleWake(),
		deadLetterLog: loop.NewDeadLetterLog(logger, "eos: handler failed; sending input to dead-letter topic", loop.DeadLetterLogEvery)}
	if c.state != nil {
		p.state = newKeyedState(c.state, c.inputTopics[0], logger)
		p.state.restored = p.restored
		p.state.wake = p.wake.signal
		p.state.keys = &keyLocator{input: c.inputTopics[0], p: c.state.others}
		if c.keyPartitioner != nil {
			p.state.keys.p = c.keyPartitioner
		}
		p.handlerState = handlerState{late: p.lateRecord, keyLanes: c.concurrency > 1 && c.order == KeyOrder,
			changelog: c.state.changelog, deadLetters: c.onError.DeadLetterTopics(), ttl: c.state.ttlSet, joins: &joinedTables{}}
		p.state.joins = p.handlerState.joins
		if c.state.ttlSet {
			p.handler = withTTL(p.handler, c.state.ttl)
		}
		if c.endpointSet {
			p.state.owners = &owners{conn: c.connOpts(), group: c.group, input: c.inputTopics[0], consumerProtocol: c.consumerProtocol}
		}
	}
	if c.keyPartitioner != nil { // validated: with state
		p.handler = withKeyPartitioning(p.handler, c.keyPartitioner, p.state.partitionCount)
	}
	return p, nil
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
	case loop.CheckPolicy(c.onError, true) != nil:
		return fail("OnHandlerError", loop.CheckPolicy(c.onError, true).Error())
	case c.semantics == AtMostOnce && c.onError.Retries():
		// The batch's offsets are committed at poll: a retry would
		// handle the records before the failing one again.
		return fail("OnHandlerError", "at-most-once never handles a record twice, and a Retry would handle the batch's records before the failing one again: use Stop or DeadLetter")
	}
	for _, t := range c.inputTopics {
		if slices.Contains(c.onError.DeadLetterTopics(), t) {
			return fail("OnHandlerError", "the dead-letter topic "+t+" is also an input topic")
		}
	}
	if c.state != nil {
		if err := c.state.validate(c); err != nil {
			return err
		}
	}
	if c.purgeSet {
		return fail("PurgeRepartition", "a processor has no repartition topic: the option is NewGrouped's")
	}
	if c.keyPartitioner != nil && c.state == nil {
		return fail("RequireKeyPartitioning", "the check is for aggregations by key, which need Changelog")
	}
	if c.endpointSet && c.state == nil {
		return fail("Endpoint", "an endpoint serves the keyed state, which needs Changelog")
	}
	if err := validateTables(c); err != nil {
		return err
	}
	if err := validateJoined(c); err != nil {
		return err
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
// same transactional id took over, a *[eoskit.RecordError] under the [eoskit.Stop] policy
// (or once a [eoskit.Retry]'s attempts ran out), a *DeadLetterError when a dead
// letter cannot be written, a *HangingTransactionError under
// [StopWhenHanging], a *[eoskit.ConfigError] when the cluster refuses
// [RepairHangingTransactions] or lacks the dead-letter topic (checked
// when Run starts, and when a dead letter finds it deleted), and other errors only when the client fails
// repeatedly. A Processor runs once at a time ([eoskit.ErrRunning] otherwise); to
// restart, call Run again.
func (p *Processor) Run(ctx context.Context) error {
	return p.shell.Run(ctx, loop.Spec{
		Pkg: "eos", Obs: p.obs, Logger: p.logger, Drain: p.cfg.drain,
		Start: p.start,
		Session: func(ctx, work context.Context) (bool, error) {
			committedBefore := p.committed.Load()
			var err error
			if p.cfg.semantics == ExactlyOnce {
				err = p.runTransactional(work, ctx)
			} else {
				err = p.runPlain(work, ctx)
			}
			// Only restarts in a row count: a session that committed
			// something was healthy, and the next failure starts over.
			return p.committed.Load() > committedBefore, err
		},
		// An end whose outcome is unknown leaves the client's view of
		// the committed offsets uncertain; a new session re-reads them
		// from the broker and re-registers the transactional id, which
		// bumps the epoch and aborts anything left open.
		Restarts: loop.Restarts{Base: time.Second, Limit: 30 * time.Second, InARow: maxSessionRestarts},
		Stopped: func(error) {
			p.deadLetterLog.Flush()
			for i := len(p.stops) - 1; i >= 0; i-- {
				p.stops[i]()
			}
			p.stops = nil
		},
	})
}

// start checks, once per Run, what a session cannot fix: the connection
// and the consumer protocol, the dead-letter topic and the changelog; and
// restores the global tables, which it keeps current until Run returns,
// and starts following the co-partitioned tables.
func (p *Processor) start(ctx context.Context) error {
	p.refused = &authz.Watch{Group: p.cfg.group, Grace: authz.DefaultGrace}
	if err := loop.StartChecks(ctx, "eos", p.cfg.connOpts(), p.cfg.consumerProtocol, p.logger); err != nil {
		return err
	}
	if err := p.checkDeadLetterTopic(ctx); err != nil {
		return err
	}
	if err := p.checkChangelog(ctx); err != nil {
		return err
	}
	// What each starts is stopped when Run returns, a later one failing
	// included.
	for _, follow := range []func(context.Context) (func(), error){p.describeOwners, p.followTables, p.restoreTables, p.followStandbys} {
		stop, err := follow(ctx)
		if err != nil {
			return err
		}
		p.stops = append(p.stops, stop)
	}
	return nil
}

// describeOwners gives the owners' descriptions (Endpoint) a client of
// the Run's; nothing without an Endpoint.
func (p *Processor) describeOwners(context.Context) (func(), error) {
	if p.state == nil || p.state.owners == nil {
		return func() {}, nil
	}
	return p.state.owners.start()
}

// maxSessionRestarts bounds the restarts in a row, without a commit in
// between, before Run gives up. Each new session first retries its
// producer id for up to claimPatience, so with the doubling backoff between
// sessions (1 s up to 30 s) this rides out over ten minutes of broker
// outage.
const maxSessionRestarts = 10

// Health returns what the processor shows probes and dashboards: see
// [eoskit.Health]. Safe to call at any time, from any goroutine.
func (p *Processor) Health() eoskit.Health {
	h := p.obs.Health()
	if p.state != nil {
		if r := p.state.restoringNow(); len(r) > 0 {
			h.Restoring = map[string][]int32{p.state.input: r}
		}
	}
	return h
}
