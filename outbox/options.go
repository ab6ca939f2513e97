package outbox

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
)

// Option configures a [Relay]. Options are checked once, in [NewRelay]: a
// missing or malformed one fails there with an *eos.ConfigError naming it.
type Option func(*config)

type config struct {
	brokers        []string
	txnID          string
	slot           string
	key            string // the position record's key: system id/slot, settled by Run
	token          string // the slot's incarnation, read by each session
	publication    string
	positionTopic  string
	deadLetter     string
	semantics      eos.Semantics
	commitInterval time.Duration
	maxRecords     int
	deleteBatch    int
	retryFor       time.Duration
	statusInterval time.Duration
	txnTimeout     time.Duration // the producer's, settled by NewRelay
	logger         *slog.Logger
	metrics        eos.Metrics
	clientOpts     []kgo.Opt
	hooks          hooks
}

func newConfig(opts []Option) *config {
	c := &config{
		publication:    Publication,
		positionTopic:  DefaultPositionTopic,
		semantics:      eos.ExactlyOnce,
		commitInterval: 100 * time.Millisecond,
		maxRecords:     10000,
		deleteBatch:    1000,
		retryFor:       2 * time.Minute,
		statusInterval: 10 * time.Second,
		logger:         slog.Default(),
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

func (c *config) check() error {
	bad := func(setting, reason string) error {
		return &eos.ConfigError{Package: "outbox", Setting: setting, Semantics: c.semantics, Reason: reason}
	}
	switch {
	case len(c.brokers) == 0:
		return bad("Brokers", "at least one seed broker is required")
	case c.slot != "" && !validSlotName(c.slot):
		return bad("Slot", fmt.Sprintf("%q is not a replication slot name (lower-case letters, digits and _, at most 63)", c.slot))
	case c.positionTopic == "" && c.semantics == eos.ExactlyOnce:
		return bad("PositionTopic", "exactly-once keeps the relay's position in a Kafka topic; it can not be empty")
	case c.semantics != eos.ExactlyOnce && c.semantics != eos.AtLeastOnce:
		return bad("WithSemantics", "a relay is exactly-once (the default) or at-least-once; at-most-once would confirm the database position before Kafka has the records")
	case c.commitInterval <= 0:
		return bad("CommitInterval", "must be positive")
	case c.maxRecords <= 0:
		return bad("MaxRecordsPerCommit", "must be positive")
	case c.retryFor <= 0:
		return bad("RetryFor", "must be positive")
	case c.statusInterval <= 0:
		return bad("StatusInterval", "must be positive")
	}
	return nil
}

// DefaultPositionTopic is where an exactly-once [Relay] keeps its position
// unless [PositionTopic] names another.
const DefaultPositionTopic = "eoskit-outbox-positions"

// Brokers sets the seed brokers. Required.
func Brokers(addrs ...string) Option {
	return func(c *config) { c.brokers = append(c.brokers, addrs...) }
}

// TransactionalID sets the relay's Kafka transactional id. Default:
// "eoskit-outbox-", the server's system identifier, "-" and the slot's
// name. Every relay of one slot must use the same id: it is what fences a
// zombie relay (a stalled or partitioned one) once its replacement
// starts. And no relay of another slot (or database) may use it: relays
// sharing an id fence each other; one fenced more than 5 times in 10
// minutes with no other relay on its slot stops with eos.ErrFenced.
func TransactionalID(id string) Option {
	return func(c *config) { c.txnID = id }
}

// Slot names the logical replication slot the relay reads. Default: the
// database's own ([DefaultSlot]), which [Migrate] creates. Another slot must be created with
// [CreateSlot] before the first record is written, or records written
// before it are never relayed. One slot feeds one relay at a time.
func Slot(name string) Option {
	return func(c *config) { c.slot = name }
}

// PositionTopic names the topic where an exactly-once relay commits its
// position (the end LSN of the last database transaction it published),
// inside the Kafka transaction that carries the records. Default:
// [DefaultPositionTopic]. It must exist (the relay never creates topics):
// Run looks it up when it starts (a Metadata request, which needs only
// Describe on it) and returns an *eos.ConfigError naming PositionTopic if
// it is missing, or has been deleted since (a produce to it failed as
// UNKNOWN_TOPIC_OR_PARTITION, within about 15 s: franz-go first refreshes
// its metadata a few times). One partition, cleanup.policy=compact
// and the replication factor of the output topics are right. Several
// slots, and servers, may share it: each keeps its own key (the server's
// system identifier and the slot's name); a relay reads it to its end at
// start, counting only committed records, without waiting for the
// transactions other slots' relays have open on it.
func PositionTopic(topic string) Option {
	return func(c *config) { c.positionTopic = topic }
}

// DeadLetterTopic sends a record Kafka refuses as its own fault (too large,
// an invalid or corrupt record, or pinned with [WriteToPartition] to a
// partition its topic does not have) to topic instead,
// inside the same transaction, with headers naming the outbox row, the
// original topic and the error; the record is also kept whole in
// [DeadLetterTable] for an operator. The topic must exist: like the
// position topic, Run looks it up when it starts, and a missing one (or
// one deleted since) is an *eos.ConfigError naming DeadLetterTopic.
// Default: none, and the relay stops with a *[RecordError] (the
// record is not lost: the relay publishes it once it is accepted, for
// example after max.message.bytes is raised).
func DeadLetterTopic(topic string) Option {
	return func(c *config) { c.deadLetter = topic }
}

// WithSemantics chooses between eos.ExactlyOnce (the default: records and
// position in one Kafka transaction) and eos.AtLeastOnce (an idempotent
// producer, and the replication slot confirmed after Kafka acknowledged the
// records, which is how common relays work: a crash between the two
// republishes). At-least-once exists as the baseline to compare with.
func WithSemantics(s eos.Semantics) Option {
	return func(c *config) { c.semantics = s }
}

// CommitInterval bounds how long the relay gathers database transactions
// into one Kafka transaction. Default: 100ms. A Kafka transaction always
// holds whole database transactions.
func CommitInterval(d time.Duration) Option {
	return func(c *config) { c.commitInterval = d }
}

// MaxRecordsPerCommit closes a Kafka transaction once it holds this many
// records, at the end of the database transaction that reached it.
// Default: 10,000 (at 1,000 the commits cost a third of the relay's
// throughput on a 2-core machine; make bench measures it). The relay
// keeps a transaction's records in memory until it commits. One database transaction larger than this becomes one
// Kafka transaction of its own size; it must be publishable, as one
// batch, within the transaction timeout (kgo.TransactionTimeout, default
// 40s). Finding a refused record in it does not have to be: the relay
// probes its records in aborted Kafka transactions of bounded size
// first (see the package documentation, Faults).
func MaxRecordsPerCommit(n int) Option {
	return func(c *config) { c.maxRecords = n }
}

// RetryFor bounds how long the relay keeps retrying without publishing
// anything while PostgreSQL or Kafka are unreachable (or an output topic
// is missing) before Run returns the last error. Default: 2 minutes. A
// missing position or dead-letter topic is not retried: it is an
// *eos.ConfigError within seconds.
func RetryFor(d time.Duration) Option {
	return func(c *config) { c.retryFor = d }
}

// StatusInterval sets how often the relay tells PostgreSQL where it is,
// even with nothing to publish. Default: 10s. A relay that starts while
// another holds the slot stands by, and takes over once the holder has
// been silent for three intervals: a stalled relay is replaced after
// about 3x this. PostgreSQL's wal_sender_timeout (default 60s) must be
// longer than the interval: the relay sends a status update every
// interval, while it waits for Kafka too (for up to the transaction
// timeout).
func StatusInterval(d time.Duration) Option {
	return func(c *config) { c.statusInterval = d }
}

// Logger sets the logger. Default: slog.Default(). The relay logs restarts
// and their causes at Warn, and a final error at Error.
func Logger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithMetrics sets where the relay reports what it does, through the
// [eos.Metrics] every eoskit runner reports to (eosprom's labels it
// "outbox"): Committed for each Kafka transaction (or, at-least-once,
// each acknowledged batch) with the outbox rows it covered and the records
// it published (dead letters excepted), Aborted with "produce-error",
// "database-error", "refused", "fenced", "timeout", "outcome-unknown" or
// "shutdown", Fenced (another relay took over), and DeadLettered.
// Default: nowhere.
func WithMetrics(m eos.Metrics) Option { return func(c *config) { c.metrics = m } }

// ClientOptions passes franz-go options to the relay's producer (TLS,
// SASL, kprom or kotel hooks, kgo.TransactionTimeout). Options the relay
// owns (seed brokers, transactional id, partitioner) are set after them.
func ClientOptions(opts ...kgo.Opt) Option {
	return func(c *config) { c.clientOpts = append(c.clientOpts, opts...) }
}

// hooks are points where tests inject faults; production code leaves them
// nil.
type hooks struct {
	// beforeCommit runs inside the Kafka transaction, after its records
	// and position were produced, just before it commits.
	beforeCommit func()
	// afterCommit runs once a batch committed, before the slot is told;
	// true ends the session there, as a crash would.
	afterCommit func() bool
	// hideFromDeletion: rows it reports are passed over by the
	// deletions, as if their transactions were not visible yet.
	hideFromDeletion func(id int64) bool
}

func validSlotName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}
