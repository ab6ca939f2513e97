package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/topiccheck"
	"github.com/eoskit/eoskit/state"
)

// tableFollower fetches a co-partitioned table's partitions, read_committed,
// for the input partitions whose records reach them, into one buffer per
// partition. Before a transaction handles a partition's polled records
// (prepare, outside the handlers and their budget), it waits until the
// buffer holds what those records may meet; the handlers then advance the
// table in the keyed state from the buffer without waiting (advance). A
// buffer keeps its records until the committed position passed them, so
// that an aborted transaction applies them again.
type tableFollower struct {
	topic  string
	keys   tableKeys // the topic's, in the keyed state
	wait   time.Duration
	conn   []kgo.Opt
	logger *slog.Logger
	// id is the ID of the topic Run started on (zero when the cluster
	// gives none): state whose table came from another (sameTopic), or
	// fetches of another (fetch), are refused. Set before the fetching
	// starts, never written again.
	id kadm.TopicID
	// semantics is the processor's, as its *eoskit.ConfigErrors name it.
	semantics string
	// maxBuffered is maxTableBuffered (tests lower it).
	maxBuffered int
	// index is the table's in the processor's WithTables, under which a
	// partition's memo keeps its position (see tablememo.go).
	index int

	mu sync.Mutex
	// gone is why the topic is not the one Run started on (deleted, or
	// created again), once known: every prepare returns it, a new
	// client included.
	gone error
	// cl fetches the table; reset replaces it (and its goroutine, which
	// stops once its client is no longer cl).
	cl   *kgo.Client
	adm  *kadm.Client
	done chan struct{} // closed when cl's goroutine returned
	// changed is closed, and replaced, when a buffer took records.
	changed chan struct{}
	parts   map[int32]*tableBuffer
	// dropped are the partitions cl stopped fetching: taking one up
	// again replaces the client (a fetch of the former consumption may
	// be in the fetching goroutine's hands).
	dropped map[int32]bool
}

// tableBuffer is one table partition's fetched records.
type tableBuffer struct {
	// recs are the committed data records fetched from offset from on,
	// in offset order, none missing.
	recs []*kgo.Record
	from int64
	// next is the offset after the last record fetched (control records
	// included: a transaction's marker takes an offset); end the
	// committed end last known (-1 until listed); ready the end prepare
	// saw fetched (-1: none), which the handlers' advance may count on.
	next, end, ready int64
	paused           bool
	// err is the partition's last fetch error (nil once it fetches).
	err error
}

// tableWaitStep is how often a wait for table records looks again
// without news (a fetch wakes it at once).
const tableWaitStep = 100 * time.Millisecond

// tableFetchWait is how long a table's fetch waits for records: a
// partition added waits for the fetch under way to its leader to return,
// so a short wait bounds how long its first records wait, at the cost of
// four fetches a second per broker while the table is idle.
const tableFetchWait = 250 * time.Millisecond

// maxTableBuffered is how many fetched records a table partition's
// buffer holds before its fetching pauses (records later than the
// input's time wait there); prepare resumes it when it needs more.
const maxTableBuffered = 1 << 16

func newTableFollower(conn []kgo.Opt, t *Table, id kadm.TopicID, s Semantics, logger *slog.Logger) (*tableFollower, error) {
	f := &tableFollower{topic: t.topic, keys: newTableKeys(t.topic), wait: t.timeout, conn: conn, id: id, semantics: checkedAgainst(s), logger: logger.With("table", t.topic),
		changed: make(chan struct{}), parts: map[int32]*tableBuffer{}, dropped: map[int32]bool{}, maxBuffered: maxTableBuffered}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.startLocked(); err != nil {
		return nil, err
	}
	return f, nil
}

// startLocked starts a client and its fetching goroutine (f.mu held).
func (f *tableFollower) startLocked() error {
	cl, err := kgo.NewClient(append(slices.Clone(f.conn), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(tableFetchWait),
		// franz-go v1.22.3's Close kills a fetch session while a fetch
		// may be building its request from it (a data race -race
		// reports); a session saves little for a few partitions.
		kgo.DisableFetchSessions())...)
	if err != nil {
		return fmt.Errorf("eos: the table %q's client: %w", f.topic, err)
	}
	f.cl, f.adm, f.done = cl, kadm.NewClient(cl), make(chan struct{})
	go f.fetch(cl, f.done)
	return nil
}

// close closes the client and waits for its goroutine.
func (f *tableFollower) close() {
	f.mu.Lock()
	cl, done := f.cl, f.done
	f.cl = nil
	f.mu.Unlock()
	cl.Close()
	<-done
}

// reset drops every buffer and fetches afresh with a new client: the
// position in the keyed state went back before a buffer's start (a
// changelog restored from further back), which a client fetching forward
// cannot serve. A new client has no fetch of the former one in flight.
func (f *tableFollower) resetLocked() error {
	f.cl.Close() // its goroutine returns: its client is no longer f.cl
	f.parts, f.dropped = map[int32]*tableBuffer{}, map[int32]bool{}
	return f.startLocked()
}

// closed stops fetching partition p, whose store was closed (moved to
// another instance, or the session ended), and drops its buffer.
func (f *tableFollower) closed(p int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.parts[p]; !ok || f.cl == nil {
		return
	}
	delete(f.parts, p)
	f.dropped[p] = true
	f.cl.RemoveConsumePartitions(map[string][]int32{f.topic: {p}})
}

// fetch polls cl until it is closed, adding what comes to the buffers.
func (f *tableFollower) fetch(cl *kgo.Client, done chan struct{}) {
	defer close(done)
	for {
		fs := cl.PollFetches(context.Background())
		if fs.IsClientClosed() {
			return
		}
		f.mu.Lock()
		if f.cl != cl {
			f.mu.Unlock()
			return
		}
		failed := false
		fs.EachError(func(_ string, p int32, err error) {
			failed = true
			if b := f.parts[p]; b != nil {
				b.err = err
			}
		})
		fs.EachTopic(func(ft kgo.FetchTopic) {
			if id := kadm.TopicID(ft.TopicID); f.other(id) {
				// A client started after the topic was created again
				// follows the new one.
				f.goneLocked(f.createdAgain(fmt.Sprintf("was created again while followed: its fetches carry topic ID %s, and Run started on %s", id, f.id), nil))
			}
		})
		took := false
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			b := f.parts[fp.Partition]
			if b == nil || len(fp.Records) == 0 || f.gone != nil {
				return
			}
			b.take(fp)
			took = true
			if len(b.recs) > f.maxBuffered && !b.paused {
				cl.PauseFetchPartitions(map[string][]int32{f.topic: {fp.Partition}})
				b.paused = true
			}
		})
		if took || f.gone != nil {
			close(f.changed)
			f.changed = make(chan struct{})
		}
		f.mu.Unlock()
		if failed {
			// A partition's error franz-go keeps (UNKNOWN_TOPIC_ID
			// once the topic is gone) comes back at once, fetch after
			// fetch: pace them.
			time.Sleep(tableWaitStep)
		}
	}
}

// take adds a fetch's records (their client is the buffer's: records
// come once each, in offset order).
func (b *tableBuffer) take(fp kgo.FetchTopicPartition) {
	b.err = nil
	if fp.LastStableOffset > b.end {
		b.end = fp.LastStableOffset
	}
	for _, r := range fp.Records {
		if r.Offset < b.next {
			continue
		}
		b.next = r.Offset + 1
		if !r.Attrs.IsControl() && r.Offset >= b.from {
			b.recs = append(b.recs, r)
		}
	}
}

// after returns the index of the first buffered record at or after
// offset pos.
func (b *tableBuffer) after(pos int64) int {
	return sort.Search(len(b.recs), func(i int) bool { return b.recs[i].Offset >= pos })
}

// upTo returns the buffered records from offset pos on that the table's
// advance to time at applies (the rule of [Table]: in offset order, up to
// the first later than at), and whether such a later record stops it.
func (b *tableBuffer) upTo(pos int64, at time.Time) (apply []*kgo.Record, later bool) {
	recs := b.recs[b.after(pos):]
	for i, r := range recs {
		if r.Timestamp.After(at) {
			return recs[:i], true
		}
	}
	return recs, false
}

// prepare waits, before input partition p's polled records (the latest
// of them at latest) are handled, until the buffer of table partition p
// holds every record they may meet: from at, the position of the
// transaction under way (pos, the committed one, between transactions),
// to a record later than latest or to the committed end known. It drops
// what the committed position passed. It waits for up to wait without a
// record fetched, then asks for a new session with a *TableStallError; a
// refused Read is an *eoskit.AuthorizationError; a topic whose end lies
// before pos, or that its client found deleted, an *eoskit.ConfigError.
func (f *tableFollower) prepare(ctx context.Context, p int32, pos, at int64, latest time.Time, wait time.Duration) error {
	start := time.Now()
	deadline := start.Add(wait)
	var lastNext int64 = -1
	for {
		f.mu.Lock()
		if gone := f.gone; gone != nil {
			f.mu.Unlock()
			return gone
		}
		b := f.parts[p]
		if b != nil && pos < b.from {
			if err := f.resetLocked(); err != nil {
				f.mu.Unlock()
				return loop.Restart(err)
			}
			b = nil
		}
		if b == nil && f.dropped[p] {
			if err := f.resetLocked(); err != nil {
				f.mu.Unlock()
				return loop.Restart(err)
			}
		}
		if b == nil {
			b = &tableBuffer{from: pos, next: pos, end: -1, ready: -1}
			f.parts[p] = b
			f.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{f.topic: {p: kgo.NewOffset().At(pos)}})
		}
		if i := b.after(pos); i > 0 {
			b.recs = slices.Clone(b.recs[i:])
		}
		b.from = pos
		_, later := b.upTo(max(pos, at), latest)
		if b.paused && (!later || len(b.recs) < f.maxBuffered/2) {
			// A paused partition's end is stale (only fetches move it):
			// fetch again, and list the end anew.
			f.cl.ResumeFetchPartitions(map[string][]int32{f.topic: {p}})
			b.paused, b.end = false, -1
		}
		if fetchErr := b.err; errors.Is(fetchErr, kerr.UnknownTopicID) {
			// franz-go never adopts a topic's new ID: the topic this
			// client follows may be gone, or a broker lags.
			f.mu.Unlock()
			return f.confirm(ctx, p, fetchErr)
		}
		if b.end < 0 {
			f.mu.Unlock()
			if err := f.listEnd(ctx, p, pos, wait); err != nil {
				return err
			}
			continue
		}
		if later {
			f.mu.Unlock()
			return nil
		}
		if max(b.next, pos, at) >= b.end {
			b.ready = max(b.ready, b.end)
			f.mu.Unlock()
			return nil
		}
		if b.next != lastNext {
			lastNext, deadline = b.next, time.Now().Add(wait)
		}
		changed, next, end, fetchErr := f.changed, b.next, b.end, b.err
		f.mu.Unlock()
		if authz.Refused(fetchErr) {
			return &eoskit.AuthorizationError{Permission: fmt.Sprintf("Read on the table's topic %q", f.topic), Err: fetchErr}
		}
		if time.Now().After(deadline) {
			return loop.Restart(&TableStallError{Topic: f.topic, Partition: p, Waited: time.Since(start).Round(time.Millisecond), At: next, End: end, Err: fetchErr})
		}
		wait := time.NewTimer(tableWaitStep)
		select {
		case <-changed:
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return ctx.Err()
		}
		wait.Stop()
	}
}

// listEnd learns partition p's committed end (its last stable offset),
// refusing one before pos: the topic was created again (or truncated),
// and the table the keyed state holds is not the topic's. Records before
// the log's start are gone (retention): the buffer counts them fetched.
func (f *tableFollower) listEnd(ctx context.Context, p int32, pos int64, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lo, err := f.adm.ListCommittedOffsets(lctx, f.topic)
		starts, startErr := f.adm.ListStartOffsets(lctx, f.topic)
		cancel()
		err = errors.Join(err, startErr)
		l, ok := lo.Lookup(f.topic, p)
		s, sok := starts.Lookup(f.topic, p)
		if ok && sok && s.Err != nil && l.Err == nil {
			l.Err = s.Err
		}
		switch {
		case ok && l.Err != nil:
			err = l.Err
		case ok:
			err = nil
		case err == nil:
			err = errors.New("no offset listed")
		}
		switch {
		case err == nil && l.Offset < pos:
			return f.createdAgain(fmt.Sprintf("ends at offset %d in partition %d, before the position %d the keyed state holds: it was created again or truncated", l.Offset, p, pos), nil)
		case err == nil:
			f.mu.Lock()
			if b := f.parts[p]; b != nil {
				b.end = max(b.end, l.Offset)
				if sok {
					b.next = max(b.next, s.Offset)
				}
			}
			f.mu.Unlock()
			return nil
		case authz.Refused(err):
			return &eoskit.AuthorizationError{Permission: fmt.Sprintf("Describe on the table's topic %q", f.topic), Err: err}
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return loop.Restart(&TableStallError{Topic: f.topic, Partition: p, Waited: wait, At: pos, End: -1, Err: err})
		}
		loop.Sleep(ctx, tableWaitStep)
	}
}

// sameTopic refuses the table of input partition p's keyed state when
// it came from another topic (of the same name: deleted and created
// again since) than the one Run started on, id being the one the state
// records: its offsets are not this topic's. State without an ID (no
// table record applied yet, or written before eoskit kept it) is taken
// as it is.
func (f *tableFollower) sameTopic(p int32, id kadm.TopicID) error {
	if !f.other(id) {
		return nil
	}
	return f.createdAgain(fmt.Sprintf("was created again: the keyed state of partition %d holds the table of topic ID %s, and the topic's ID is %s", p, id, f.id), nil)
}

// confirm asks the cluster afresh whether the topic a fetch of partition
// p found unknown (fetchErr) is gone: deleted, or created again under
// another ID, which ends Run (and every later prepare) with a
// *eoskit.ConfigError; or, as the topic Run started on, only lagging in a
// broker's metadata, which restarts the session.
func (f *tableFollower) confirm(ctx context.Context, p int32, fetchErr error) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	tds, err := topiccheck.Describe(dctx, f.conn, f.topic)
	cancel()
	td, ok := tds[f.topic]
	var gone error
	switch {
	case err != nil:
	case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
		gone = f.createdAgain("was deleted while followed", fetchErr)
	case td.Err == nil && f.other(td.ID):
		gone = f.createdAgain(fmt.Sprintf("was created again while followed: its ID is %s, and Run started on %s", td.ID, f.id), fetchErr)
	}
	if gone == nil {
		return loop.Restart(&TableStallError{Topic: f.topic, Partition: p, At: -1, End: -1, Err: errors.Join(fetchErr, err)})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.goneLocked(gone)
}

// other reports whether id, a topic's ID as the keyed state, a fetch or
// the metadata gives it, names another topic than the one Run started
// on. A zero ID (none known) is no other.
func (f *tableFollower) other(id kadm.TopicID) bool {
	return id != (kadm.TopicID{}) && f.id != (kadm.TopicID{}) && id != f.id
}

// goneLocked notes why the topic is gone, unless a reason is already
// noted, and returns the one noted (f.mu held).
func (f *tableFollower) goneLocked(why error) error {
	if f.gone == nil {
		f.gone = why
	}
	return f.gone
}

// createdAgain is the *eoskit.ConfigError of a table topic that is not the
// one the keyed state holds, why saying how, err what showed it.
func (f *tableFollower) createdAgain(why string, err error) error {
	return &eoskit.ConfigError{Package: "eos", Setting: "WithTables", Semantics: f.semantics, Err: err, Reason: fmt.Sprintf(
		"the table %q %s; reset the processor's state (its changelog) to read the table afresh", f.topic, why)}
}

// advance applies to kv, the keyed state of input partition p, the table
// records of p from kv's position on whose time is at or before at,
// stopping at the first later one (see [Table]). It never waits: prepare
// fetched what the record may meet. Should the buffer not hold it, the
// session restarts (no record's fault).
func (f *tableFollower) advance(call *stateCtx, kv state.KV, p int32, at time.Time) error {
	pos, known := call.tablePosition(f.index)
	if !known {
		var err error
		if pos, err = tablePosition(kv, f.topic, f.keys.position); err != nil {
			return err
		}
		call.learnedTablePosition(f.index, pos)
	}
	f.mu.Lock()
	b := f.parts[p]
	var apply []*kgo.Record
	ready := false
	if b != nil && pos >= b.from {
		var later bool
		apply, later = b.upTo(pos, at)
		last := pos
		if len(apply) > 0 {
			last = apply[len(apply)-1].Offset + 1
		}
		ready = later || max(b.next, last) >= b.ready && b.ready >= 0
	}
	var next, end int64 = -1, -1
	if b != nil {
		next, end = b.next, b.ready
	}
	f.mu.Unlock()
	if !ready {
		return loop.Restart(&TableStallError{Topic: f.topic, Partition: p, At: next, End: end,
			Err: errors.New("the table's buffer does not hold what the record may meet (not prepared)")})
	}
	for _, r := range apply {
		if err := f.put(kv, p, r); err != nil {
			return err
		}
	}
	if len(apply) == 0 {
		return nil
	}
	if f.id != (kadm.TopicID{}) {
		// The state records which topic its table came from (once:
		// sameTopic refused another before the record was handled).
		id, err := tableTopicID(kv, f.topic)
		if err != nil {
			return err
		}
		if id != f.id {
			if err := kv.Put(tableTopicIDKey(f.topic), f.id[:]); err != nil {
				return err
			}
		}
	}
	to := apply[len(apply)-1].Offset + 1
	if err := kv.Put(f.keys.position, strconv.AppendInt(nil, to, 10)); err != nil {
		return err
	}
	call.movedTable(f.index, to)
	return nil
}

// put writes the table record r to kv: its value, or its key's deletion
// for a tombstone. A record too large for the changelog ends Run: no
// input record is to blame, and it can never be written.
func (f *tableFollower) put(kv state.KV, p int32, r *kgo.Record) error {
	if r.Key == nil {
		return nil // a table record without a key updates no key
	}
	k := f.keys.value(r.Key)
	var err error
	if r.Value == nil {
		err = kv.Delete(k)
	} else {
		err = kv.Put(k, r.Value)
	}
	if errors.Is(err, state.ErrTooLarge) {
		return &eoskit.ConfigError{Package: "eos", Setting: "WithTables", Semantics: f.semantics, Err: err,
			Reason: fmt.Sprintf("the table %q's record at partition %d offset %d does not fit the changelog: %v", f.topic, p, r.Offset, err)}
	}
	return err
}

// TableStallError is why a processor joining a [Table] could not go on:
// table records known to be committed were not fetched within the table's
// [TableRestoreTimeout]. The session restarts; Run returns it after
// restarts in a row.
type TableStallError struct {
	Topic     string
	Partition int32
	Waited    time.Duration
	// At is the offset the table's partition was fetched to, End its
	// committed end listed (-1: not listed).
	At, End int64
	// Err is the partition's last fetch (or listing) error, if any.
	Err error
}

func (e *TableStallError) Error() string {
	s := fmt.Sprintf("eos: table %q partition %d: fetched to offset %d of %d, no record fetched for %s", e.Topic, e.Partition, e.At, e.End, e.Waited)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *TableStallError) Unwrap() error { return e.Err }
