package eos

import (
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"
)

// IdempotentOption is an option of [NewIdempotentProducer].
//
// Options are typed by the constructors that use them, in the manner of
// franz-go's kgo.ProducerOpt and kgo.ConsumerOpt: an option given to a
// constructor that cannot use it does not compile. Each constructor takes
// its own interface, and an option's return type says which constructors
// it applies to:
//
//   - [Option] ([Brokers], [Logger], [ClientOptions]) applies to all three;
//   - [TransactionalIDOption] ([TransactionalID]) to
//     [NewTransactionalProducer] and [NewProcessor];
//   - [ProcessorOption] (every other option) to [NewProcessor] only.
//
// Values are checked once, in the constructor: a missing, malformed or
// contradictory one fails there with a *[eoskit.ConfigError] naming it, never
// later. A contradiction with the chosen [Semantics] (a transactional id
// under AtLeastOnce, say) depends on values, so it is checked there too.
type IdempotentOption interface {
	apply(*config)
	idempotentOption()
}

// TransactionalOption configures [NewTransactionalProducer].
type TransactionalOption interface {
	apply(*config)
	transactionalOption()
}

// ProcessorOption configures [NewProcessor]. A processor's options are
// gathered in a slice of them:
//
//	opts := []eos.ProcessorOption{eos.Brokers(b), eos.Group(g), eos.Topics(in)}
type ProcessorOption interface {
	apply(*config)
	processorOption()
}

// Option configures any of the three constructors.
type Option interface {
	IdempotentOption
	TransactionalOption
	ProcessorOption
}

// TransactionalIDOption configures the constructors that run
// transactions: [NewTransactionalProducer] and [NewProcessor].
type TransactionalIDOption interface {
	TransactionalOption
	ProcessorOption
}

// anyOpt applies to every constructor, txnOpt to those that run
// transactions, processorOpt to NewProcessor only.
type (
	anyOpt       func(*config)
	txnOpt       func(*config)
	processorOpt func(*config)
)

func (o anyOpt) apply(c *config)       { o(c) }
func (anyOpt) idempotentOption()       {}
func (anyOpt) transactionalOption()    {}
func (anyOpt) processorOption()        {}
func (o txnOpt) apply(c *config)       { o(c) }
func (txnOpt) transactionalOption()    {}
func (txnOpt) processorOption()        {}
func (o processorOpt) apply(c *config) { o(c) }
func (processorOpt) processorOption()  {}

type config struct {
	// keyPartitioner: RequireKeyPartitioning's (nil: no check).
	keyPartitioner kgo.Partitioner
	// purge, purgeSet: PurgeRepartition's (NewGrouped's alone).
	purge          time.Duration
	purgeSet       bool
	brokers        []string
	txnID          string
	semantics      Semantics
	group          string
	inputTopics    []string
	commitInterval time.Duration
	maxRecords     int
	onError        eoskit.ErrorPolicy
	concurrency    int
	order          Order
	drain          time.Duration
	hangCheck      time.Duration
	onHang         HangingPolicy
	logger         *slog.Logger
	metrics        eoskit.Metrics
	clientOpts     []kgo.Opt
	state          *stateConfig // nil: stateless (see Changelog)
	tables         []*GlobalTable
	joined         []*Table // WithTables
	// endpoint is Endpoint's URL (endpointSet: it was given).
	endpoint    string
	endpointSet bool

	// consumerProtocol: ConsumerProtocol was given; Run checks the
	// cluster serves it.
	consumerProtocol bool

	// hangCheckSet and onHangSet record that the hanging-transaction
	// options were given, so that a semantics without transactions
	// refuses them rather than ignore them.
	hangCheckSet, onHangSet bool
}

func newConfig[O interface{ apply(*config) }](opts []O) *config {
	c := &config{
		semantics:      ExactlyOnce,
		commitInterval: 100 * time.Millisecond,
		maxRecords:     100_000,
		onError:        eoskit.Stop(),
		concurrency:    1,
		drain:          10 * time.Second,
		hangCheck:      10 * time.Second,
		logger:         slog.Default(),
	}
	for _, o := range opts {
		o.apply(c)
	}
	return c
}

func (c *config) requireBrokers() error {
	if len(c.brokers) == 0 {
		return &eoskit.ConfigError{Package: "eos", Setting: "Brokers", Reason: "at least one seed broker is required"}
	}
	for _, b := range c.brokers {
		if strings.TrimSpace(b) == "" {
			return &eoskit.ConfigError{Package: "eos", Setting: "Brokers", Reason: "empty broker address"}
		}
	}
	return nil
}

// Brokers sets the seed brokers (host:port). Required.
func Brokers(addrs ...string) Option {
	return anyOpt(func(c *config) { c.brokers = append(c.brokers, addrs...) })
}

// TransactionalID sets the producer's transactional id. Required by
// [NewTransactionalProducer] and by an ExactlyOnce [Processor]; a
// processor under the weaker semantics refuses it, and
// [NewIdempotentProducer] does not compile with it. It must be stable
// across restarts of the same instance, and unique among instances running
// at once: build it with [StableTransactionalID].
func TransactionalID(id string) TransactionalIDOption {
	return txnOpt(func(c *config) { c.txnID = id })
}

// WithSemantics sets a [Processor]'s delivery semantics. Default:
// ExactlyOnce. AtLeastOnce and AtMostOnce run the same handler with a plain
// consumer and producer, committing offsets after or before processing; they
// exist to compare against and for pipelines that accept the weaker
// guarantee.
func WithSemantics(s Semantics) ProcessorOption {
	return processorOpt(func(c *config) { c.semantics = s })
}

// Group sets a [Processor]'s consumer group. Required.
func Group(group string) ProcessorOption {
	return processorOpt(func(c *config) { c.group = group })
}

// Topics sets the topics a [Processor] consumes. Required.
func Topics(topics ...string) ProcessorOption {
	return processorOpt(func(c *config) { c.inputTopics = append(c.inputTopics, topics...) })
}

// CommitInterval bounds how long a [Processor] keeps one transaction (or,
// under the weaker semantics, one batch) open before committing it. Default:
// 100ms. Longer intervals amortise the commit over more records; shorter
// ones lower end-to-end latency, since read_committed readers see output
// only once it is committed. Under ExactlyOnce it must be at most half the
// transaction timeout (kgo.TransactionTimeout, default 40s), or
// NewProcessor refuses it. A transaction that outlives the timeout anyway
// (a handler slower than it, a long GC pause) is aborted by the broker; the
// processor then restarts its session and reads the batch again (it does
// not take the broker's epoch error for fencing).
func CommitInterval(d time.Duration) ProcessorOption {
	return processorOpt(func(c *config) { c.commitInterval = d })
}

// MaxRecordsPerCommit bounds how many input records one transaction (or
// batch) of a [Processor] covers. Default: 100,000. Whichever of this and
// [CommitInterval] is reached first ends the transaction; the processor
// polls at most 1,000 records at a time per lane ([Concurrency]: fewer,
// what a lane can handle in the interval), so it looks at the interval at
// least that often. A transaction has a fixed cost (on Kafka 4.x, its
// first produce to a partition can wait up to 20 ms for the previous
// transaction's markers), so the bound decides what one busy partition
// can carry: a copy through one partition made 3.9 times as many
// records a second at 10,000 as at 1,000, and a count by key from its
// start over a backlog of 6,000,000 records 1.37 to 1.49 times as many at
// 100,000 as at 10,000 (make bench's backlog part). At the default
// interval the bound is reached only above a million records a second.
// Under AtLeastOnce and AtMostOnce the loop keeps a batch's records until
// it commits: up to this many. Under
// ExactlyOnce, a transaction whose handlers ran out of its budget (three
// quarters of the transaction timeout) makes the processor take fewer
// records per transaction, and it takes more again, up to this bound,
// while transactions end well within the budget.
func MaxRecordsPerCommit(n int) ProcessorOption {
	return processorOpt(func(c *config) { c.maxRecords = n })
}

// OnHandlerError sets what a [Processor] does with an input record whose
// handler returned an error or panicked, or whose output failed for its
// own sake (too large, invalid): [eoskit.Stop] (the default),
// [eoskit.Retry] (then, with [eoskit.ErrorPolicy.Then], Stop or
// [DeadLetter]) or [DeadLetter], or [eoskit.Classify] to choose among them
// by the error. Under Stop and Retry the transaction in which the record
// failed is aborted first, so none of the outputs the batch had emitted so
// far is visible; the batch is then read again: under Retry after the
// pause, under Stop not before Run is called again (the record's offset is
// not committed). DeadLetter writes the record to its topic in the same
// transaction, which commits its offset and goes on (see [DeadLetter]). NewProcessor refuses a dead letter without a topic
// (offsetstore's and dedup's park in a table) with a *[eoskit.ConfigError].
// A handler error wrapping [eoskit.ErrInvalidConfig] (a *[eoskit.ConfigError]:
// an aggregation without [Changelog], a windowed one under KeyOrder lanes)
// is no record's fault: Run ends with it, whatever the policy.
func OnHandlerError(p eoskit.ErrorPolicy) ProcessorOption {
	return processorOpt(func(c *config) { c.onError = p })
}

// DrainTimeout bounds how long a [Processor] drains when Run's ctx ends
// (SIGTERM, say): it stops polling, lets the handlers under way finish,
// commits what they completed with the offsets of every record polled
// into the transaction (it handles those too), and returns nil. It is all
// or nothing over what was polled: only past the timeout does it cancel
// the handlers' ctx and abort the whole transaction, whose inputs are then
// read again by whoever takes the partitions.
// Default: 10s; 0 aborts at once. Keep it below the time the platform
// waits before it kills the process (Kubernetes: terminationGracePeriod,
// 30s by default).
func DrainTimeout(d time.Duration) ProcessorOption {
	return processorOpt(func(c *config) { c.drain = d })
}

// Order is what a [Processor] running handlers at once keeps in order: see
// [Concurrency].
type Order int8

const (
	// PartitionOrder runs records of different input partitions at once;
	// a partition's records run one at a time, in offset order.
	PartitionOrder Order = iota
	// KeyOrder also runs records of one partition at once when their keys
	// differ; records of one key (and all records without a key) run one
	// at a time, in offset order.
	KeyOrder
)

// Concurrency lets a [Processor] run up to n handler calls at once, in
// lanes: one per input partition under [PartitionOrder], or, under
// [KeyOrder], several per partition by a hash of the key (4n: lanes are
// short, so that they end close together; n handlers run at once). Each lane
// handles its records in offset order and produces a record's outputs
// before it handles the next. Under PartitionOrder, outputs keep their
// inputs' order per input partition. Under KeyOrder they keep it only per
// key: two records of one partition with different keys may be handled,
// and their outputs written, in either order. Default: 1, one record at a
// time in poll order.
//
// Lanes are fed across polls: the processor hands each poll's records to
// their lanes, which run on, and polls again while the commit interval
// lasts. Since franz-go fills a poll partition by partition (with a
// backlog, one poll holds one partition's buffered records), polls are
// sized to what a lane can handle before the interval ends, from the time
// recent records took (one record per lane until that is known), and a
// partition whose lanes hold that much is paused
// (kgo.Client.PauseFetchPartitions) until they run dry, so that the next
// poll takes the other partitions'. With a backlog every lane is busy, and
// a slow record holds up only its own lane. Paused partitions are resumed
// when the transaction ends; a paused partition's buffered records are
// fetched again. A resumed partition joins the next fetch to its broker
// once the fetch in flight returns, so under Concurrency above 1 the
// client's kgo.FetchMaxWait is 100 ms unless [ClientOptions] sets one.
//
// Nothing else changes: one transaction still covers exactly the records
// polled into it, and commits only once every lane has handled its
// records and every output is acknowledged: about a commit interval after
// it began, or, while the busiest lane still holds records then, when it
// is done (lanes that run dry meanwhile take more records until at most
// two intervals after it began; the lanes then finish what they hold).
// A record that fails stops the other lanes at their next record and
// follows [OnHandlerError].
// The handler must then be safe for concurrent use. It pays off for
// handlers that wait (a call to another service): a handler that takes 5
// ms handles at most 200 records a second one at a time.
func Concurrency(n int, order Order) ProcessorOption {
	return processorOpt(func(c *config) { c.concurrency, c.order = n, order })
}

// HangingTransactionCheck sets how often an exactly-once [Processor] looks
// for its own hanging transactions in the partition of __consumer_offsets
// that holds its group's offsets and in the partitions it wrote to; it
// also looks before it registers its transactional id and before its
// first transaction after a broker connection closed. Default: 10s; 0
// turns the check off. What it does with one it finds is
// [OnHangingTransaction]'s policy: by default it stops, writing nothing.
//
// A transaction hangs when a partition holds it open while its
// transaction coordinator has ended it (KIP-664), so that no marker will
// ever close it. Apache Kafka 4.1 to 4.4 leaves such transactions behind
// when a partition is leaderless while the coordinator writes its markers
// (KAFKA-20734), which every restart of a single broker causes; the chaos
// suite met them in its broker-kill and broker-restart scenarios, even for
// transactions whose EndTxn answered success. In __consumer_offsets one
// holds a pending offset commit, and the group's partitions with one are
// never consumed again (their offset fetch answers UNSTABLE_OFFSET_COMMIT
// for good); in an output partition it holds the last stable offset back,
// and read_committed readers see nothing past it. Worse, the producer's
// next transaction writing to that partition joins it, and one marker then
// decides both: records lost or aborted ones made visible. So the
// processor begins no transaction while it knows of one. It learns of one
// at the sweeps above; a hang that a bounce leaves between two sweeps, in a
// partition the processor keeps writing to, can be joined before the next
// one (on a cluster with replication, where leadership moves on a bounce,
// the chaos suite has not seen one form).
//
// For each, it works out the outcome the transaction's records already
// have, to report it (and, under [RepairHangingTransactions], to write it):
// read from the log of the output partitions it wrote to (the marker that
// closed them there), else from its own EndTxn answer, else from the
// coordinator's state right after that transaction (transaction protocol
// v2 gives every transaction its own epoch); it looks only at transactions
// of its own producer id, and only at ones the partitions still hold open
// after the coordinator was asked.
//
// Looking needs, besides what the processor needs anyway (Describe on the
// transactional id, for DescribeTransactions, comes with Write on it), Read
// on the output topics (DescribeProducers, and reading markers back), and
// Read on __consumer_offsets to cover the group's offsets partition too:
// without that one the check covers the outputs alone and says so once at
// Warn. Repairing needs ClusterAction too. A cluster that refuses the
// rest, or does not support them, turns the check off at once with one
// warning naming the ACLs to grant, and the
// processor starts without waiting. On a cluster that lists no
// __consumer_offsets topic (franz-go's kfake) the check covers only the
// output partitions, and says so once at Warn. It applies only under
// [ExactlyOnce].
func HangingTransactionCheck(interval time.Duration) ProcessorOption {
	return processorOpt(func(c *config) { c.hangCheck, c.hangCheckSet = interval, true })
}

// OnHangingTransaction sets what an exactly-once [Processor] does when
// [HangingTransactionCheck] finds one of its transactions hanging:
// [StopWhenHanging] (the default), [WaitWhenHanging] or
// [RepairHangingTransactions].
func OnHangingTransaction(p HangingPolicy) ProcessorOption {
	return processorOpt(func(c *config) { c.onHang, c.onHangSet = p, true })
}

// Logger sets the logger. Default: slog.Default(), so that an Error-level
// event is never silent unless the caller chose so. eos logs transaction outcomes,
// rebalances and fencing at Info and Warn; franz-go's own logs are not
// routed here (add kgo.WithLogger with plugin/kslog through ClientOptions).
func Logger(l *slog.Logger) Option {
	return anyOpt(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithMetrics sets where a [Processor] reports what it does (see
// [eoskit.Metrics]). Default: nowhere. eosprom.New gives a Prometheus
// implementation, which offsetstore and dedup runners may share.
func WithMetrics(m eoskit.Metrics) ProcessorOption {
	return processorOpt(func(c *config) {
		if m != nil {
			c.metrics = m
		}
	})
}

// ClientOptions passes franz-go options through to the underlying client:
// TLS, SASL, timeouts, hooks (plugin/kprom), logging (plugin/kslog). They
// are applied after the semantics preset; one that contradicts the preset
// (kgo.RequiredAcks(kgo.LeaderAck()) under ExactlyOnce, say) fails the
// constructor with a *[eoskit.ConfigError] rather than silently weakening it.
// Options eos sets itself (seed brokers, group, topics, transactional id)
// must be given with eos's own options: NewProcessor refuses
// kgo.ConsumerGroup, ConsumeTopics, ConsumeRegex, ConsumePartitions and
// TransactionalID here with a *[eoskit.ConfigError]. Partition callbacks
// (kgo.OnPartitionsAssigned, OnPartitionsRevoked, OnPartitionsLost) are
// kept: the processor runs its own, then the caller's.
func ClientOptions(opts ...kgo.Opt) Option {
	return anyOpt(func(c *config) { c.clientOpts = append(c.clientOpts, opts...) })
}

// kgoOpts assembles the franz-go options: the preset first, then the
// caller's pass-through options, then the identity options eos owns.
func (c *config) kgoOpts(roles ...Role) []kgo.Opt {
	var opts []kgo.Opt
	for _, r := range roles {
		switch r {
		case RoleProducer:
			opts = append(opts, c.semantics.ProducerOptions()...)
		case RoleConsumer:
			opts = append(opts, c.semantics.ConsumerOptions()...)
		}
	}
	if c.concurrency > 1 && slices.Contains(roles, RoleConsumer) {
		// Lanes fed across polls pause and resume partitions (see
		// feed); the user's options come after, and may set another.
		opts = append(opts, kgo.FetchMaxWait(loop.PipelineFetchMaxWait))
	}
	opts = append(opts, c.connOpts()...)
	if c.txnID != "" {
		opts = append(opts, kgo.TransactionalID(c.txnID))
	}
	if c.group != "" {
		opts = append(opts, kgo.ConsumerGroup(c.group), kgo.ConsumeTopics(c.inputTopics...))
	}
	if c.state != nil && c.state.others != nil { // set by NewProcessor
		opts = append(opts, kgo.RecordPartitioner(changelogPartitioner{c.state.changelog, c.state.others}))
	}
	if c.state != nil && c.state.limits != nil { // set by NewProcessor
		opts = append(opts, kgo.ProducerBatchMaxBytesFn(c.state.limits.limit))
	}
	return opts
}

// connOpts are what a client of the processor's own (a reader, an admin)
// needs to reach the cluster: the pass-through options and the brokers.
func (c *config) connOpts() []kgo.Opt {
	return append(append([]kgo.Opt{}, c.clientOpts...), kgo.SeedBrokers(c.brokers...))
}
