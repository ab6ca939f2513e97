package outbox

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// Option configures a [Relay]. Options are checked once, in [NewRelay]: a
// missing or malformed one fails there with an *eoskit.ConfigError naming it.
type Option interface{ relayOption(*config) }

// MigrateOption configures [Migrate] and [DefaultSlot]: [Name] and [Slot],
// the same as the relay's.
type MigrateOption interface{ migrateOption(*names) }

// WriterOption configures [NewWriter]: [Name], the same as the relay's.
type WriterOption interface{ writerOption(*names) }

// NameOption is what [Name] returns: [NewRelay], [Migrate], [DefaultSlot]
// and [NewWriter] all take it, so that one value names the outbox for
// each.
type NameOption interface {
	Option
	MigrateOption
	WriterOption
}

// SlotOption is what [Slot] returns: [NewRelay], [Migrate] and
// [DefaultSlot] take it.
type SlotOption interface {
	Option
	MigrateOption
}

// relayOption is an option only a relay takes.
type relayOption func(*config)

func (o relayOption) relayOption(c *config) { o(c) }

type config struct {
	brokers []string
	txnID   string
	// names: the outbox's table and publication, and its slot (Slot's,
	// or settled by Run from the outbox's and the database's names).
	names
	key            string // the position record's key: system id/slot, settled by Run
	token          string // the slot's incarnation, read by each session
	positionTopic  string
	deadLetter     string
	semantics      eos.Semantics
	commitInterval time.Duration
	maxRecords     int
	deleteBatch    int
	retryFor       time.Duration
	statusInterval time.Duration
	txnTimeout     time.Duration // the producer's, settled by NewRelay
	markerWait     time.Duration // see defaultMarkerWait
	logger         *slog.Logger
	metrics        eoskit.Metrics
	clientOpts     []kgo.Opt
	hooks          hooks
}

func newConfig(opts []Option) *config {
	c := &config{
		positionTopic:  DefaultPositionTopic,
		semantics:      eos.ExactlyOnce,
		commitInterval: 100 * time.Millisecond,
		maxRecords:     10000,
		deleteBatch:    1000,
		retryFor:       2 * time.Minute,
		statusInterval: 10 * time.Second,
		markerWait:     defaultMarkerWait,
		logger:         slog.Default(),
	}
	for _, o := range opts {
		o.relayOption(c)
	}
	return c
}

func (c *config) check() error {
	bad := func(setting, reason string) error {
		return &eoskit.ConfigError{Package: "outbox", Setting: setting, Semantics: c.semantics.String(), Reason: reason}
	}
	if err := c.names.check(); err != nil {
		return err
	}
	switch {
	case len(c.brokers) == 0:
		return bad("Brokers", "at least one seed broker is required")
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
	case c.deadLetter != "" && c.deadLetter == c.positionTopic:
		return bad("DeadLetter", "the dead-letter topic is the position topic: a dead letter there would be read as a relay's position")
	}
	return nil
}

// DefaultPositionTopic is where an exactly-once [Relay] keeps its position
// unless [PositionTopic] names another.
const DefaultPositionTopic = "eoskit-outbox-positions"

// Brokers sets the seed brokers. Required.
func Brokers(addrs ...string) Option {
	return relayOption(func(c *config) { c.brokers = append(c.brokers, addrs...) })
}

// TransactionalID sets the relay's Kafka transactional id. Default:
// "eoskit-outbox-", the server's system identifier, "-" and the slot's
// name. Every relay of one slot must use the same id: it is what fences a
// zombie relay (a stalled or partitioned one) once its replacement
// starts. And no relay of another slot (or database) may use it: relays
// sharing an id fence each other; one fenced more than 5 times in 10
// minutes with no other relay on its slot stops with eos.ErrFenced.
func TransactionalID(id string) Option {
	return relayOption(func(c *config) { c.txnID = id })
}

// Name names a service's outbox, so that several services share one
// database, each with an outbox and a relay of its own that publishes only
// its rows. Give the same Name to [Migrate], [NewWriter] (the writes) and
// [NewRelay]. Default: none, the outbox eoskit always had ([Table]).
//
// From the name come the outbox's table, eoskit_outbox_<name> (its
// publication is named alike), the tables beside it,
// eoskit_outbox_<name>_dead_letters, _schema, _relays (its relays'
// heartbeats) and _slots (its slots' tokens), and
// its replication slot, eoskit_outbox_<name>_<database> (slot names are
// the server's; see [DefaultSlot]), unless [Slot] names another. The
// slot's name keys the relay's position in the position topic and makes
// its default transactional id, so those differ per outbox too.
//
// A name holds only lower-case letters, digits and _, at most 36 bytes
// (its tables' names must fit PostgreSQL's 63), and is not, and does not
// end with, _dead_letters, _schema, _relays or _slots (the names of the
// tables beside an outbox's). Another is an *eoskit.ConfigError naming Name,
// from the constructor or Migrate, before anything reaches the server.
func Name(name string) NameOption { return nameOption(name) }

type nameOption string

func (o nameOption) relayOption(c *config)  { o.migrateOption(&c.names) }
func (o nameOption) writerOption(n *names)  { o.migrateOption(n) }
func (o nameOption) migrateOption(n *names) { n.name, n.named = string(o), true }

// Slot names the logical replication slot the relay reads. Default: the
// outbox's own ([DefaultSlot]: from the outbox's [Name], if it has one,
// and the database's name), which [Migrate] creates. Give [Migrate] the same
// Slot, and it creates that slot instead, and no other; or create it with
// [CreateSlot]. Either way before the first record is written: records
// written before it are never relayed. One slot feeds one relay at a
// time; a slot reads one outbox. A name that is not a slot's (lower-case
// letters, digits and _, at most 63 bytes) is an *eoskit.ConfigError naming
// Slot.
func Slot(name string) SlotOption { return slotOption(name) }

type slotOption string

func (o slotOption) relayOption(c *config)  { o.migrateOption(&c.names) }
func (o slotOption) migrateOption(n *names) { n.slot = string(o) }

// PositionTopic names the topic where an exactly-once relay commits its
// position (the end LSN of the last database transaction it published),
// inside the Kafka transaction that carries the records. Default:
// [DefaultPositionTopic]. It must exist (the relay never creates topics):
// Run looks it up when it starts (a Metadata request, which needs only
// Describe on it) and returns an *eoskit.ConfigError naming PositionTopic if
// it is missing, or has been deleted since (a produce to it failed as
// UNKNOWN_TOPIC_OR_PARTITION, within about 15 s: franz-go first refreshes
// its metadata a few times). One partition, cleanup.policy=compact
// and the replication factor of the output topics are right. Several
// slots, and servers, may share it: each keeps its own key (the server's
// system identifier and the slot's name); a relay reads it to its end at
// start, counting only committed records, without waiting for the
// transactions other slots' relays have open on it.
func PositionTopic(topic string) Option {
	return relayOption(func(c *config) { c.positionTopic = topic })
}

// DeadLetter sends a record Kafka refuses as its own fault (too large,
// an invalid or corrupt record, or pinned with [WriteToPartition] to a
// partition its topic does not have) to topic instead (as eos's
// DeadLetter policy does with a processor's failing input),
// inside the same transaction, with headers naming the outbox row, the
// original topic and the error; the record is also kept whole in
// [DeadLetterTable] (a named outbox's, in
// eoskit_outbox_<name>_dead_letters) for an operator. The topic must
// exist: like the position topic, Run looks it up when it starts, and a missing one (or
// one deleted since) is an *eoskit.ConfigError naming DeadLetter.
// Default: none, and the relay stops with a *[RecordError] (the
// record is not lost: the relay publishes it once it is accepted, for
// example after max.message.bytes is raised).
func DeadLetter(topic string) Option {
	return relayOption(func(c *config) { c.deadLetter = topic })
}

// WithSemantics chooses between eos.ExactlyOnce (the default: records and
// position in one Kafka transaction) and eos.AtLeastOnce (an idempotent
// producer, and the replication slot confirmed after Kafka acknowledged the
// records, which is how common relays work: a crash between the two
// republishes). At-least-once exists as the baseline to compare with.
func WithSemantics(s eos.Semantics) Option {
	return relayOption(func(c *config) { c.semantics = s })
}

// CommitInterval bounds how long the relay gathers database transactions
// into one Kafka transaction. Default: 100ms. A Kafka transaction always
// holds whole database transactions.
func CommitInterval(d time.Duration) Option {
	return relayOption(func(c *config) { c.commitInterval = d })
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
	return relayOption(func(c *config) { c.maxRecords = n })
}

// RetryFor bounds how long the relay keeps retrying without publishing
// anything while PostgreSQL or Kafka are unreachable (or an output topic
// is missing) before Run returns the last error, and how long it waits
// for Kafka to take one batch (franz-go would retry its produce for
// ever). Past it, with Kafka away, the end of the transaction under way
// and then its abort each give up within 30 s: Run returns within RetryFor
// and a minute. Default: 2 minutes. A missing position or dead-letter topic is
// not retried: it is an *eoskit.ConfigError within seconds. A wait for
// Kafka longer than 5 s shows meanwhile: it is the relay's Health
// LastError (not Healthy until a batch commits), and a Warn line every
// 30 s.
func RetryFor(d time.Duration) Option {
	return relayOption(func(c *config) { c.retryFor = d })
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
	return relayOption(func(c *config) { c.statusInterval = d })
}

// Logger sets the logger. Default: slog.Default(). The relay logs restarts
// and their causes at Warn, and a final error at Error.
func Logger(l *slog.Logger) Option {
	return relayOption(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithMetrics sets where the relay reports what it does, through the
// [eoskit.Metrics] every eoskit runner reports to (eosprom's labels it
// "outbox"): Committed for each Kafka transaction (or, at-least-once,
// each acknowledged batch) with the outbox rows it covered and the records
// it published (dead letters excepted), Aborted with "produce-error",
// "database-error", "refused", "fenced", "timeout", "outcome-unknown" or
// "shutdown", Fenced (another relay took over), and DeadLettered.
// Default: nowhere.
func WithMetrics(m eoskit.Metrics) Option {
	return relayOption(func(c *config) { c.metrics = m })
}

// ClientOptions passes franz-go options to the relay's producer (TLS,
// SASL, kprom or kotel hooks, kgo.TransactionTimeout). Options the relay
// owns (seed brokers, transactional id, partitioner) are set after them.
func ClientOptions(opts ...kgo.Opt) Option {
	return relayOption(func(c *config) { c.clientOpts = append(c.clientOpts, opts...) })
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
	// readTxn runs once a database transaction of rows was read from the
	// slot, as a slow read of a large one would take its time.
	readTxn func(rows int)
}
