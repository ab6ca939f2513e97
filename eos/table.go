package eos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/topiccheck"
	"github.com/eoskit/eoskit/state"
)

// Table is a co-partitioned table, Kafka Streams' KTable of a
// stream–table join: a compacted topic keyed as the input is, with as
// many partitions, whose partition p is materialized in the keyed state of
// input partition p. A processor given it ([WithTables]) joins each
// input record with the table as of the record's time ([JoinTable]).
//
// What holds:
//   - Timestamp order. Before a record of input partition p is handled,
//     the table's partition p advances, in offset order, through every
//     committed table record whose timestamp is at or before the
//     record's (a tie goes to the table), and stops at the first that is
//     later. Input records out of order never move the table back: it
//     stands at the latest input time seen.
//   - Exactly once. The table's records are written to the processor's
//     changelog, with the table's position, in the transaction that
//     commits the input's offsets: after a crash, a rebalance or a
//     fencing, the records handled again start from the table the last
//     commit left and meet what the aborted attempt met, unless table
//     records their times reach were committed since (the idle rule).
//   - Committed records only (read_committed): a table record of an
//     aborted transaction is never seen.
//
// The idle rule (Kafka Streams' max.task.idle.ms of 0): before a
// transaction handles a partition's polled records (outside the handlers
// and their budget), the table's partition is fetched up to a record
// later than the latest of them, or to its committed end known (listed
// when the partition is first met, then read from each fetch), waiting
// up to [TableRestoreTimeout] without a record fetched; then the session
// restarts with a *[TableStallError] (Run ends after restarts in a row).
// It does not wait for table records not yet written: a table update
// produced after the stream's record it should join is a race the join
// cannot see. Write the table first, or give it earlier timestamps.
//
// What breaks it: a table topic whose partition count differs from the
// input's (a *[eoskit.ConfigError] at Run), or keyed by another
// partitioner than the input; a table topic deleted, created again or
// truncated (Run ends with a *[eoskit.ConfigError]: the state records the
// ID of the topic its table came from; a topic created again while
// followed is noticed by the fetches, the transactions before that
// meeting the table the state holds). The table doubles in the changelog: each table
// record is written there once more, in the transaction of the first
// input record that reaches its time, and a newly met partition's
// catch-up is one transaction (see docs/state.md for its limit).
type Table struct {
	tableSettings
	inUse atomic.Bool
}

// NewTable returns the co-partitioned table of topic, for [WithTables]
// and [JoinTable]. Of the [TableOption]s, it takes [TableRestoreTimeout].
func NewTable(topic string, opts ...TableOption) *Table {
	return &Table{tableSettings: newTableSettings(topic, opts)}
}

// Topic returns the table's topic.
func (t *Table) Topic() string { return t.topic }

// WithTables gives a stateful processor ([Changelog]) co-partitioned
// tables to follow, for [JoinTable]. Run refuses, with a
// *[eoskit.ConfigError], a table topic that does not exist or whose
// partition count differs from the input's; a table given to two
// processors running at once is refused by the second's Run, and two
// tables of one topic by NewProcessor. The processor needs Describe and
// Read on each table's topic.
func WithTables(tables ...*Table) ProcessorOption {
	return processorOpt(func(c *config) { c.joined = append(c.joined, tables...) })
}

// JoinTable is a handler joining each record with t (a stream–table
// join): join gets the record and the value of its key in t as of the
// record's time (see [Table]), ok false for a key the table does not
// hold (or a record without a key). It returns join's outputs; join's
// error is the record's fault (see [OnHandlerError]). The processor
// must be given t ([WithTables]) and handle each partition in order
// (not [KeyOrder] under [Concurrency]).
func JoinTable(t *Table, join func(ctx context.Context, r *kgo.Record, value []byte, ok bool) ([]*kgo.Record, error)) HandlerFunc {
	keys := newTableKeys(t.topic)
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		hs := handlerStateOf(ctx)
		refuse := func(reason string) error {
			return &eoskit.ConfigError{Package: "eos", Setting: "JoinTable", Reason: reason}
		}
		var f *tableFollower
		if hs.joins != nil {
			f = hs.joins.of(t)
		}
		switch {
		case hs.kv == nil:
			return nil, refuse("a join needs Changelog: the table is materialized in the keyed state")
		case hs.keyLanes:
			return nil, refuse("the table follows each partition in order: use PartitionOrder, not KeyOrder")
		case f == nil:
			return nil, refuse(fmt.Sprintf("table %q is not given to the processor (WithTables)", t.topic))
		}
		if err := f.advance(hs.call, hs.kv, r.Partition, r.Timestamp); err != nil {
			return nil, err
		}
		var value []byte
		var ok bool
		if r.Key != nil {
			var err error
			if value, ok, err = hs.kv.Get(keys.value(r.Key)); err != nil {
				return nil, err
			}
		}
		return join(ctx, r, value, ok)
	}
}

// tablePositionKey is where the offset of the next record of topic's
// table to apply lives in the keyed state (see tableKeys).
func tablePositionKey(topic string) []byte {
	return []byte(state.ReservedPrefix + "table-position/" + topic)
}

// tableKeys are a table's keys in the keyed state, made once (a join
// reads them for every record): the prefix of its values' keys (the
// prefix, then the record's key: value) and its position's key
// (tablePositionKey's). Both are only read.
type tableKeys struct{ prefix, position []byte }

func newTableKeys(topic string) tableKeys {
	return tableKeys{prefix: []byte(state.ReservedPrefix + "table/" + topic + "\x00"), position: tablePositionKey(topic)}
}

// value is the key of key's value (a slice of its own).
func (k tableKeys) value(key []byte) []byte {
	return append(k.prefix[:len(k.prefix):len(k.prefix)], key...)
}

// tablePosition reads the position of topic's table (its key in kv:
// tablePositionKey's) in kv: the offset of the next table record to
// apply (0 before its first record).
func tablePosition(kv interface {
	Get(key []byte) ([]byte, bool, error)
}, topic string, key []byte) (int64, error) {
	v, ok, err := kv.Get(key)
	if err != nil || !ok {
		return 0, err
	}
	n, err := state.Int64(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("eos: table %q: a position %q that is no offset in the keyed state", topic, v)
	}
	return n, nil
}

// tableTopicIDKey is where the ID of the topic whose records the keyed
// state applied lives, beside the position (a key of its own: versions
// that do not know it read the position as before).
func tableTopicIDKey(topic string) []byte {
	return []byte(state.ReservedPrefix + "table-topic-id/" + topic)
}

// tableTopicID reads the ID of the topic whose records the table of
// topic in kv came from: zero before the first record, or in state
// written before eoskit kept it.
func tableTopicID(kv interface {
	Get(key []byte) ([]byte, bool, error)
}, topic string) (kadm.TopicID, error) {
	var id kadm.TopicID
	v, ok, err := kv.Get(tableTopicIDKey(topic))
	switch {
	case err != nil || !ok:
		return id, err
	case len(v) != len(id):
		return id, fmt.Errorf("eos: table %q: a topic ID of %d bytes in the keyed state, not %d", topic, len(v), len(id))
	}
	copy(id[:], v)
	return id, nil
}

// validateJoined checks the co-partitioned tables' settings.
func validateJoined(c *config) error {
	for i, t := range c.joined {
		refuse := func(reason string) error {
			return &eoskit.ConfigError{Package: "eos", Setting: "WithTables", Semantics: checkedAgainst(c.semantics), Reason: reason}
		}
		switch {
		case t == nil:
			return refuse("a nil table")
		case t.topic == "":
			return refuse("a table without a topic")
		case c.state == nil:
			return refuse(fmt.Sprintf("table %q: a co-partitioned table is materialized in the keyed state: give the processor Changelog", t.topic))
		case t.refreshSet:
			return refuse(fmt.Sprintf("table %q: RefreshInterval is a global table's; a co-partitioned table follows its topic as records come", t.topic))
		case t.timeout <= 0:
			return refuse(fmt.Sprintf("table %q: its restore timeout must be positive", t.topic))
		case c.state.ttlSet:
			return refuse(fmt.Sprintf("table %q: TTL would expire the table's keys", t.topic))
		case c.concurrency > 1 && c.order == KeyOrder:
			return refuse(fmt.Sprintf("table %q: the table follows each partition in order: use PartitionOrder, not KeyOrder", t.topic))
		case slices.Contains(c.inputTopics, t.topic):
			return refuse(fmt.Sprintf("table %q is also an input topic", t.topic))
		case t.topic == c.state.changelog || t.topic == c.state.updates:
			return refuse(fmt.Sprintf("table %q is the processor's changelog or updates topic", t.topic))
		case slices.Contains(c.onError.DeadLetterTopics(), t.topic):
			return refuse(fmt.Sprintf("table %q is a dead-letter topic", t.topic))
		case slices.ContainsFunc(c.joined[i+1:], func(u *Table) bool { return u != nil && u.topic == t.topic }):
			// Two Tables of one topic would apply its records to the
			// same keys of the state, each from its own position.
			return refuse(fmt.Sprintf("table %q is given twice", t.topic))
		case slices.ContainsFunc(c.tables, func(g *GlobalTable) bool { return g != nil && g.topic == t.topic }):
			return refuse(fmt.Sprintf("table %q is also a global table", t.topic))
		}
	}
	return nil
}

// joinedTables is what a Run follows of its processor's co-partitioned
// tables: set by start, read by the handlers and the keyed state.
type joinedTables struct {
	mu        sync.RWMutex
	followers map[*Table]*tableFollower
}

func (j *joinedTables) of(t *Table) *tableFollower {
	j.mu.RLock()
	defer j.mu.RUnlock()
	return j.followers[t]
}

// following reports whether Run follows any table.
func (j *joinedTables) following() bool {
	j.mu.RLock()
	defer j.mu.RUnlock()
	return len(j.followers) > 0
}

func (j *joinedTables) each(fn func(*tableFollower)) {
	j.mu.RLock()
	defer j.mu.RUnlock()
	for _, f := range j.followers {
		fn(f)
	}
}

// followTables checks the co-partitioned tables against the input and
// starts following them, until stop is called (when Run returns).
func (p *Processor) followTables(ctx context.Context) (stop func(), err error) {
	if len(p.cfg.joined) == 0 {
		return func() {}, nil
	}
	followers := map[*Table]*tableFollower{}
	stop = func() {
		p.handlerState.joins.mu.Lock()
		p.handlerState.joins.followers = nil
		p.handlerState.joins.mu.Unlock()
		for t, f := range followers {
			f.close()
			t.inUse.Store(false)
		}
	}
	for i, t := range p.cfg.joined {
		id, err := p.checkTable(ctx, t)
		if err != nil {
			stop()
			return nil, err
		}
		if !t.inUse.CompareAndSwap(false, true) {
			stop()
			return nil, &eoskit.ConfigError{Package: "eos", Setting: "WithTables", Semantics: checkedAgainst(p.cfg.semantics),
				Reason: fmt.Sprintf("table %q is in use by another processor's Run", t.topic)}
		}
		f, err := newTableFollower(p.cfg.connOpts(), t, id, p.cfg.semantics, p.logger)
		if err != nil {
			t.inUse.Store(false)
			stop()
			return nil, err
		}
		f.index = i
		followers[t] = f
	}
	p.handlerState.joins.mu.Lock()
	p.handlerState.joins.followers = followers
	p.handlerState.joins.mu.Unlock()
	return stop, nil
}

// checkTable refuses a table topic missing, unreadable, or with another
// partition count than the input's, and returns its ID.
func (p *Processor) checkTable(ctx context.Context, t *Table) (kadm.TopicID, error) {
	refuse := func(reason string) error {
		return &eoskit.ConfigError{Package: "eos", Setting: "WithTables", Semantics: checkedAgainst(p.cfg.semantics), Reason: reason}
	}
	tds, err := topiccheck.Describe(ctx, p.cfg.connOpts(), t.topic)
	if err != nil {
		return kadm.TopicID{}, fmt.Errorf("eos: describe the table %q: %w", t.topic, err)
	}
	td, ok := tds[t.topic]
	switch {
	case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
		return td.ID, refuse(fmt.Sprintf("the table's topic %q does not exist", t.topic))
	case errors.Is(td.Err, kerr.TopicAuthorizationFailed):
		return td.ID, &eoskit.AuthorizationError{Permission: fmt.Sprintf("Describe and Read on the table's topic %q", t.topic), Err: td.Err}
	case td.Err != nil:
		return td.ID, fmt.Errorf("eos: describe the table %q: %w", t.topic, td.Err)
	case int32(len(td.Partitions)) != p.state.partitionCount():
		return td.ID, refuse(fmt.Sprintf("the table's topic %q has %d partitions and the input %q has %d: a co-partitioned table has the input's",
			t.topic, len(td.Partitions), p.state.input, p.state.partitionCount()))
	}
	return td.ID, nil
}
