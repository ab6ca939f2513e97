package eos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/changelog"
	"github.com/eoskit/eoskit/state"
)

// StateOption configures the keyed state [Changelog] gives a processor.
// Like the processor's own options, one given elsewhere does not compile.
type StateOption interface{ applyState(*stateConfig) }

type stateOpt func(*stateConfig)

func (o stateOpt) applyState(c *stateConfig) { o(c) }

// stateConfig is what Changelog and its options set.
type stateConfig struct {
	changelog      string
	stores         state.Factory
	create         bool
	requireConfigs bool
	restoreTimeout time.Duration
	restoreSet     bool // RestoreTimeout given: refused below the floor, not raised to it
	updates        string
	ttl            time.Duration
	ttlSet         bool // TTL given
	standbys       int  // Standbys
	// others is the partitioner of every record but the changelog's (see
	// changelogPartitioner), batchMax the producer's batch limit per
	// topic (kgo.ProducerBatchMaxBytesFn), and requestMax what of a
	// produce request is left for a batch once the request's own fields
	// are written (kgo.BrokerMaxWriteBytes less the fields' bytes but the
	// topic's name): all learnt by NewProcessor.
	others     kgo.Partitioner
	batchMax   func(topic string) int32
	requestMax int
	// limits caps the producer's batches to the changelog and updates
	// topics at what they take (set by NewProcessor, learnt by Run).
	limits *batchLimits
	// warm, set by NewProcessor when the group is balanced by
	// standbyBalancer, is what this instance holds warm, which the
	// standbys' follower updates and the balancer's join tells.
	warm *atomic.Pointer[[]int32]
}

// recordLimit is the largest state record the producer sends to topic:
// its batch limit there, or what a produce request leaves for the batch
// if that is less (as franz-go bounds a batch). Unknown (no function, or
// none for the topic), the topic's own limit is the only one.
func (c *stateConfig) recordLimit(topic string) int {
	limit := math.MaxInt32
	if c.batchMax != nil {
		if n := c.batchMax(topic); n > 0 {
			limit = int(n)
		}
	}
	if c.requestMax > 0 {
		limit = min(limit, c.requestMax-len(topic))
	}
	return limit
}

// produceRequestMax is what a produce request of cl leaves for one
// batch, but for the topic's name: kgo.BrokerMaxWriteBytes less the
// request's header and fields, counted as franz-go counts them (its
// sink's maxRecordBatchBytesForTopic). 0 when unknown.
func produceRequestMax(cl *kgo.Client) int {
	limit, _ := cl.OptValue(kgo.BrokerMaxWriteBytes).(int32)
	if limit <= 0 {
		return 0
	}
	clientID, _ := cl.OptValue(kgo.ClientID).(string)
	txnID, _ := cl.OptValue(kgo.TransactionalID).(string)
	const fields = 4 + 2 + 2 + 4 + 2 + // the request header: length, key, version, correlation id, client id's length
		2 + 2 + 4 + 4 + 1 + // transactional id's length, acks, timeout, topics' count, tagged fields
		2 + 4 + 4 + 4 // the topic name's length, partitions' count, the partition, the records' length
	return int(limit) - fields - len(clientID) - len(txnID)
}

// Changelog makes the processor stateful: each input partition gets a
// key-value store ([StateOf] inside the handler), whose writes are
// produced to partition of the same number of topic, a compacted
// changelog with as many partitions as the input, in the transaction that
// commits the outputs and the input offsets. Before a newly assigned
// partition's first record is handled, its store is restored from the
// changelog (read_committed); a transaction that aborts leaves the store
// as the last committed one left it. See package state for what the
// stores guarantee, and docs/state.md.
//
// Run refuses, with a *[eoskit.ConfigError] naming topic, a changelog that
// does not exist (unless [CreateChangelog]), whose partition count differs
// from the input's, or whose cleanup.policy is not compact alone
// (compact,delete would let retention delete a key not written within
// retention.ms). A stateful processor reads one input topic, under
// ExactlyOnce. Run caps the producer's batches to the changelog (and the
// [EmitUpdates] topic) at the max.message.bytes it reads there, so that
// writes that each fit are never refused together.
func Changelog(topic string, opts ...StateOption) ProcessorOption {
	return processorOpt(func(c *config) {
		s := &stateConfig{changelog: topic, stores: state.MemoryFactory(), restoreTimeout: changelog.DefaultTimeout}
		for _, o := range opts {
			o.applyState(s)
		}
		c.state = s
	})
}

// Stores sets where the partitions' committed state lives (default:
// [state.MemoryFactory], in memory, restored whole on every assignment;
// [github.com/eoskit/eoskit/state/pebblestore.Factory] keeps it on disk
// with a checkpoint, so that an assignment restores only the changelog's
// tail).
func Stores(f state.Factory) StateOption { return stateOpt(func(c *stateConfig) { c.stores = f }) }

// CreateChangelog lets Run create a missing changelog: compacted, with the
// input's partition count and the broker's default replication factor.
// It needs CreateTopics on the topic (default: off; a missing changelog
// is a configuration error).
func CreateChangelog() StateOption { return stateOpt(func(c *stateConfig) { c.create = true }) }

// RequireChangelogConfigs makes a changelog (or an [EmitUpdates] topic)
// whose configuration cannot be read (DescribeConfigs refused, as an
// application account usually is) a *[eoskit.AuthorizationError] at Run.
// By default Run logs a warning, skips the cleanup-policy check and
// assumes the broker's default max.message.bytes.
func RequireChangelogConfigs() StateOption {
	return stateOpt(func(c *stateConfig) { c.requireConfigs = true })
}

// RestoreTimeout bounds how long a partition's restore may go without
// progress (default 5 minutes): a restore whose store's checkpoint has not
// moved for that long (the changelog unreadable, a store that fails, a
// transaction left open on it past its timeout) ends Run with a
// *[state.RestoreError] naming the partition and how far it got. A
// restore that keeps applying is never cut, however long it takes (as in
// Kafka Streams). It must be at least the transaction timeout
// (kgo.TransactionTimeout, default 40 s) plus 30 s: a transaction a dead
// owner left open on the changelog holds a restore for up to that long,
// and the broker aborts it on a periodic scan (every 10 s by default).
// Unset, it is 5 minutes, or that floor when the transaction timeout makes
// it higher.
func RestoreTimeout(d time.Duration) StateOption {
	return stateOpt(func(c *stateConfig) { c.restoreTimeout, c.restoreSet = d, true })
}

// EmitUpdates produces, in every transaction that commits, one record per
// key the transaction changed to topic, with the key's final value (a
// tombstone for a deleted key), however many inputs changed it: the
// stream of updates of an aggregation ([Count], [Sum], [Reduce]), as
// Kafka Streams' record cache gives between commits. A hot key does not
// multiply the output. Its records are the changelog's, so a write must
// fit the smaller max.message.bytes of the two (read at Run; see
// [RequireChangelogConfigs]) and the producer's batch limit for each
// (kgo.ProducerBatchMaxBytesFn): one that does not fails in its handler with
// [state.ErrTooLarge]. A processor refused Write on either topic ends Run
// with a *[eoskit.AuthorizationError] naming it.
func EmitUpdates(topic string) StateOption {
	return stateOpt(func(c *stateConfig) { c.updates = topic })
}

// validate checks the state's settings against the processor's.
func (s *stateConfig) validate(c *config) error {
	refuse := func(setting, reason string) error {
		return &eoskit.ConfigError{Package: "eos", Setting: setting, Semantics: checkedAgainst(c.semantics), Reason: reason}
	}
	switch {
	case s.changelog == "":
		return refuse("Changelog", "the changelog topic is empty")
	case c.semantics != ExactlyOnce:
		return refuse("Changelog", "keyed state needs ExactlyOnce: its changelog commits in the processor's transaction")
	case len(c.inputTopics) != 1:
		return refuse("Changelog", fmt.Sprintf("a stateful processor reads one input topic (changelog partition = input partition), not %d", len(c.inputTopics)))
	case s.changelog == c.inputTopics[0]:
		return refuse("Changelog", "the changelog is the input topic")
	case s.updates == s.changelog:
		return refuse("EmitUpdates", "the updates topic is the changelog")
	case s.updates == c.inputTopics[0]:
		return refuse("EmitUpdates", "the updates topic is the input topic: every update would be counted again")
	case slices.Contains(c.onError.DeadLetterTopics(), s.changelog):
		return refuse("Changelog", "the changelog is a dead-letter topic")
	case s.updates != "" && slices.Contains(c.onError.DeadLetterTopics(), s.updates):
		return refuse("EmitUpdates", "the updates topic is a dead-letter topic")
	case s.stores == nil:
		return refuse("Stores", "no store factory")
	case s.restoreTimeout <= 0:
		return refuse("RestoreTimeout", fmt.Sprintf("%s is not a positive duration", s.restoreTimeout))
	case s.standbys < 0:
		return refuse("Standbys", fmt.Sprintf("%d is negative", s.standbys))
	case s.standbys > 0 && !c.endpointSet:
		return refuse("Standbys", "standbys are placed by the members' endpoints: give Endpoint")
	case s.ttlSet && c.concurrency > 1 && c.order == KeyOrder:
		return refuse("TTL", "keys expire by their partition's stream time, which follows the partition's order: use PartitionOrder, not KeyOrder")
	}
	if s.ttlSet {
		if err := validateTTL(s.ttl); err != nil {
			return refuse("TTL", err.Error())
		}
	}
	return nil
}

// restoreMargin is what RestoreTimeout must exceed the transaction timeout
// by: the broker aborts a dead owner's transaction on a periodic scan
// (transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by
// default), and writes its markers after.
const restoreMargin = 30 * time.Second

// kvKey carries the handler's state in its context.
type kvKey struct{}

// StateOf returns the state of the partition of the record being handled,
// as the transaction under way sees it: the committed state with the
// writes of this transaction's earlier records, and of this call, over
// it. It returns nil outside a handler of a processor given [Changelog].
//
// What a call writes is kept only if the handler returns without error:
// a record that fails (dead-lettered, retried, or ending Run) leaves no
// write behind, and a transaction that aborts leaves none of its
// records'. A write too large for the changelog fails with an error
// wrapping [state.ErrTooLarge]; returned by the handler, it is the
// record's fault (see [OnHandlerError]).
//
// The KV, like ctx, is the call's: a goroutine the handler starts must be
// done with both before the handler returns. Its writes after that are
// lost, and a windowed aggregation's or a join's bookkeeping for the
// partition may then be another record's.
func StateOf(ctx context.Context) state.KV { return handlerStateOf(ctx).kv }

// handlerState is what a handler call's context carries for its keyed
// state: its KV, and what counts a late record.
type handlerState struct {
	kv   state.KV
	late func()
	// keyLanes: records of one partition may be handled side by side
	// (Concurrency above 1 under KeyOrder).
	keyLanes bool
	// changelog and deadLetters are topics a handler may not write.
	changelog   string
	deadLetters []string
	// ttl: the store's keys expire (TTL), which a windowed aggregation
	// refuses.
	ttl bool
	// joins is what Run follows of the co-partitioned tables (see
	// JoinTable).
	joins *joinedTables
	// call is the handler call's context (set by handlerStateOf).
	call *stateCtx
}

// withKV returns ctx carrying kv and hs (whose kv and call fields it
// ignores) for one handler call, and memo, the stream time of kv's
// partition (nil: none kept). It runs for every record: one allocation,
// hs shared, not copied (context.WithValue would box a copy, a second
// one).
func withKV(ctx context.Context, kv state.KV, hs *handlerState, memo *clockMemo) *stateCtx {
	return &stateCtx{Context: ctx, kv: kv, hs: hs, memo: memo}
}

// withScope returns ctx carrying a new Scope over txn as withKV carries a
// KV, the Scope inside the context's own allocation (one a record).
func withScope(ctx context.Context, txn *state.Txn, hs *handlerState, memo *clockMemo) *stateCtx {
	c := &stateCtx{Context: ctx, hs: hs, memo: memo}
	txn.InitScope(&c.scope)
	c.kv = &c.scope
	return c
}

// stateCtx is withKV's context, one handler call's: it answers kvKey with
// itself.
type stateCtx struct {
	context.Context
	kv   state.KV
	hs   *handlerState
	memo *clockMemo
	// movedTo is where the call moved its partition's stream time
	// (encoded as clockMemo.at; 0: it did not): see streamClock.
	movedTo int64
	// sweptTo is the window bound the call's sweep left (encoded as
	// clockMemo.earliest; 0: it did not sweep): see windowbound.go.
	sweptTo int64
	// tablesMoved are where the call moved its partition's tables
	// (encoded as clockMemo.tables; 0: it did not): see tablememo.go.
	tablesMoved [memoTables]int64
	// scope is kv, when withScope made the context.
	scope state.Scope
}

func (c *stateCtx) Value(key any) any {
	if key == (kvKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// handlerStateOf returns what ctx carries (the zero handlerState outside
// a handler of a processor given Changelog).
func handlerStateOf(ctx context.Context) handlerState {
	c, _ := ctx.Value(kvKey{}).(*stateCtx)
	if c == nil {
		return handlerState{}
	}
	hs := *c.hs
	hs.kv, hs.call = c.kv, c
	return hs
}

// errNoState is what an aggregation returns when its processor has no
// changelog: a configuration error, which ends Run (no record's fault).
var errNoState = &eoskit.ConfigError{Package: "eos", Setting: "Changelog", Reason: "an aggregation handler needs Changelog"}

// Count counts the input records per key: the handler of a processor
// given [Changelog] and, for the stream of counts, [EmitUpdates]. A
// key's count is stored as decimal text ([state.Int64] reads it). With a
// processor reading "reports" keyed by region:
//
//	p, err := eos.NewProcessor(eos.Count(), eos.Brokers(b), eos.Group("dashboard"), eos.Topics("reports"),
//		eos.TransactionalID("dashboard-1"), eos.Changelog("dashboard-counts", eos.EmitUpdates("totals")))
//
// A record without a key is the record's fault (see [OnHandlerError]).
func Count() HandlerFunc {
	return Sum(func(*kgo.Record) (int64, error) { return 1, nil })
}

// Sum adds value(r) to the sum of r's key: the handler of a processor
// given [Changelog] (see [Count]). An error from value, or a sum that
// would overflow an int64, is the record's fault.
func Sum(value func(r *kgo.Record) (int64, error)) HandlerFunc {
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		kv, err := aggregating(ctx, r)
		if err != nil {
			return nil, err
		}
		n, err := value(r)
		if err != nil {
			return nil, err
		}
		_, err = state.Sum(kv, r.Key, n)
		return nil, err
	}
}

// Reduce sets the value of r's key to fn(old, r.Value), old being its
// current value (nil for a key without one); fn returning nil deletes the
// key. It is the handler of a processor given [Changelog] (see [Count]).
func Reduce(fn func(old, value []byte) []byte) HandlerFunc {
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		kv, err := aggregating(ctx, r)
		if err != nil {
			return nil, err
		}
		_, err = state.Reduce(kv, r.Key, r.Value, fn)
		return nil, err
	}
}

func aggregating(ctx context.Context, r *kgo.Record) (state.KV, error) {
	return aggregatingOn(StateOf(ctx), r)
}

// aggregatingOn returns kv, the store r is aggregated in, or why r
// cannot be.
func aggregatingOn(kv state.KV, r *kgo.Record) (state.KV, error) {
	switch {
	case kv == nil:
		return nil, errNoState
	case r.Key == nil:
		return nil, errors.New("eos: a record without a key cannot be aggregated by key")
	case state.IsReserved(r.Key):
		return nil, fmt.Errorf("eos: a record whose key begins with %q (state.ReservedPrefix) cannot be aggregated: eoskit keeps its own keys there", state.ReservedPrefix)
	}
	return kv, nil
}
