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
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/state"
)

// tableFollower fetches a co-partitioned table's partitions, read_committed,
// for the input partitions whose records reach them, into one buffer per
// partition, from which the handlers advance the table in the keyed
// state (advance). A buffer keeps its records until the transaction that
// applied them committed (committed), so that an aborted one applies
// them again.
type tableFollower struct {
	topic  string
	wait   time.Duration
	cl     *kgo.Client
	adm    *kadm.Client
	logger *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu sync.Mutex
	// changed is closed, and replaced, when a buffer took records.
	changed chan struct{}
	parts   map[int32]*tableBuffer
	// fetchErr is the last fetch error, which a stall names.
	fetchErr error
}

// tableBuffer is one table partition's fetched records.
type tableBuffer struct {
	// recs are the committed data records fetched from offset from on,
	// in offset order, none missing.
	recs []*kgo.Record
	from int64
	// next is the offset after the last record fetched (control records
	// included: a transaction's marker takes an offset); end the
	// committed end last known (-1 until listed).
	next, end int64
	paused    bool
}

// tableFetchWait is how long a table's fetch waits for records.
const tableFetchWait = 250 * time.Millisecond

// maxTableBuffered is how many fetched records a table partition's
// buffer holds before its fetching pauses (records later than the input's
// time wait there).
const maxTableBuffered = 1 << 16

func newTableFollower(conn []kgo.Opt, t *Table, logger *slog.Logger) (*tableFollower, error) {
	// A partition added waits for the fetch under way to its leader to
	// return: a short wait bounds how long a newly assigned partition's
	// first record waits for its table, at the cost of four fetches a
	// second per broker while the table is idle.
	opts := append(slices.Clone(conn), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(tableFetchWait))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("eos: the table %q's client: %w", t.topic, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &tableFollower{topic: t.topic, wait: t.timeout, cl: cl, adm: kadm.NewClient(cl), logger: logger.With("table", t.topic),
		cancel: cancel, done: make(chan struct{}), changed: make(chan struct{}), parts: map[int32]*tableBuffer{}}
	go f.fetch(ctx)
	return f, nil
}

func (f *tableFollower) close() {
	f.cancel()
	f.cl.Close()
	<-f.done
}

// fetch polls the table's partitions until ctx ends, adding what comes to
// their buffers.
func (f *tableFollower) fetch(ctx context.Context) {
	defer close(f.done)
	for {
		fs := f.cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		f.mu.Lock()
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				f.fetchErr = fmt.Errorf("partition %d: %w", p, err)
			}
		})
		took := false
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if b := f.parts[fp.Partition]; b != nil && len(fp.Records) > 0 {
				b.take(fp)
				took = true
				if len(b.recs) > maxTableBuffered && !b.paused {
					f.cl.PauseFetchPartitions(map[string][]int32{f.topic: {fp.Partition}})
					b.paused = true
				}
			}
		})
		if took {
			close(f.changed)
			f.changed = make(chan struct{})
		}
		f.mu.Unlock()
	}
}

// take adds a fetch's records. A record before next means consumption
// started again there (the partition was dropped and taken again while a
// fetch of the former consumption was under way): what the buffer holds
// from it on is replaced, as the new consumption brings it all again.
func (b *tableBuffer) take(fp kgo.FetchTopicPartition) {
	if fp.LastStableOffset > b.end {
		b.end = fp.LastStableOffset
	}
	for _, r := range fp.Records {
		if r.Offset < b.from {
			continue
		}
		if r.Offset < b.next {
			i := sort.Search(len(b.recs), func(i int) bool { return b.recs[i].Offset >= r.Offset })
			b.recs = b.recs[:i]
		}
		b.next = r.Offset + 1
		if !r.Attrs.IsControl() {
			b.recs = append(b.recs, r)
		}
	}
}

// advance applies to kv, the keyed state of input partition p, the table
// records of p from kv's position on whose time is at or before at,
// stopping at the first later one, or at the committed end known (see
// [Table]). It waits for records known to be committed but not fetched
// for up to the table's timeout without progress.
func (f *tableFollower) advance(ctx context.Context, kv state.KV, p int32, at time.Time) error {
	pos, err := tablePosition(kv, f.topic)
	if err != nil {
		return err
	}
	start := pos
	deadline := time.Now().Add(f.wait)
	for {
		f.mu.Lock()
		b := f.parts[p]
		if b == nil {
			b = &tableBuffer{from: pos, next: pos, end: -1}
			f.parts[p] = b
			f.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{f.topic: {p: kgo.NewOffset().At(pos)}})
		}
		if pos < b.from {
			// Never: the buffer keeps what was not committed (see
			// committed), and kv's position is at least the committed
			// one. Should it happen, the buffer is dropped and fetched
			// again from pos.
			f.dropLocked(p)
			f.mu.Unlock()
			continue
		}
		i := sort.Search(len(b.recs), func(i int) bool { return b.recs[i].Offset >= pos })
		var apply []*kgo.Record
		later := false
		for ; i < len(b.recs); i++ {
			if b.recs[i].Timestamp.After(at) {
				later = true
				break
			}
			apply = append(apply, b.recs[i])
		}
		caughtUp := b.end >= 0 && b.next >= b.end
		unknownEnd := b.end < 0
		if !later && !caughtUp && b.paused {
			f.cl.ResumeFetchPartitions(map[string][]int32{f.topic: {p}})
			b.paused = false
		}
		changed, fetchErr := f.changed, f.fetchErr
		f.mu.Unlock()

		for _, r := range apply {
			if err := f.put(kv, p, r); err != nil {
				return err
			}
			pos = r.Offset + 1
		}
		if len(apply) > 0 {
			deadline = time.Now().Add(f.wait)
		}
		if later || caughtUp {
			if pos == start {
				return nil
			}
			return kv.Put(tablePositionKey(f.topic), strconv.AppendInt(nil, pos, 10))
		}
		if unknownEnd {
			if err := f.listEnd(ctx, p); err != nil && time.Now().After(deadline) {
				return loop.Restart(fmt.Errorf("eos: table %q partition %d: listing its committed end: %w", f.topic, p, err))
			}
			continue
		}
		if time.Now().After(deadline) {
			return loop.Restart(&TableStallError{Topic: f.topic, Partition: p, Waited: f.wait, At: pos, End: b.end, Err: fetchErr})
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

// put writes the table record r to kv: its value, or its key's deletion
// for a tombstone. A record too large for the changelog ends Run: no
// input record is to blame, and it can never be written.
func (f *tableFollower) put(kv state.KV, p int32, r *kgo.Record) error {
	if r.Key == nil {
		return nil // a table record without a key updates no key
	}
	k := tableKey(f.topic, r.Key)
	var err error
	if r.Value == nil {
		err = kv.Delete(k)
	} else {
		err = kv.Put(k, r.Value)
	}
	if errors.Is(err, state.ErrTooLarge) {
		return &eoskit.ConfigError{Package: "eos", Setting: "WithTables", Err: err,
			Reason: fmt.Sprintf("the table %q's record at partition %d offset %d does not fit the changelog: %v", f.topic, p, r.Offset, err)}
	}
	return err
}

// listEnd learns partition p's committed end (the last stable offset).
func (f *tableFollower) listEnd(ctx context.Context, p int32) error {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lo, err := f.adm.ListCommittedOffsets(lctx, f.topic)
	l, ok := lo.Lookup(f.topic, p)
	switch {
	case ok && l.Err != nil:
		err = l.Err
	case ok:
		err = nil
	case err == nil:
		err = errors.New("no offset listed")
	}
	if err != nil {
		loop.Sleep(ctx, tableWaitStep)
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.parts[p]; b != nil && l.Offset > b.end {
		b.end = l.Offset
	}
	return nil
}

// committed drops from partition p's buffer the records a committed
// transaction applied (those before the position s holds), and resumes
// its fetching once the buffer has room.
func (f *tableFollower) committed(p int32, s state.Reader) {
	pos, err := tablePosition(s, f.topic)
	if err != nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.parts[p]
	if b == nil || pos <= b.from {
		return
	}
	i := sort.Search(len(b.recs), func(i int) bool { return b.recs[i].Offset >= pos })
	b.recs = append([]*kgo.Record(nil), b.recs[i:]...)
	b.from = pos
	if b.paused && len(b.recs) < maxTableBuffered/2 {
		f.cl.ResumeFetchPartitions(map[string][]int32{f.topic: {p}})
		b.paused = false
	}
}

// closed stops fetching partition p, whose store was closed (revoked,
// lost, or to be restored again).
func (f *tableFollower) closed(p int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropLocked(p)
}

func (f *tableFollower) dropLocked(p int32) {
	if _, ok := f.parts[p]; !ok {
		return
	}
	delete(f.parts, p)
	f.cl.RemoveConsumePartitions(map[string][]int32{f.topic: {p}})
}

// TableStallError is why a record of a processor joining a [Table]
// waited in vain: table records known to be committed were not fetched
// within the table's [TableRestoreTimeout]. The session restarts; Run
// returns it after restarts in a row.
type TableStallError struct {
	Topic     string
	Partition int32
	Waited    time.Duration
	// At is the table's position in the keyed state, End the committed
	// end listed.
	At, End int64
	// Err is the last fetch error, if any.
	Err error
}

func (e *TableStallError) Error() string {
	s := fmt.Sprintf("eos: table %q partition %d: no table record fetched for %s at offset %d with records committed up to %d", e.Topic, e.Partition, e.Waited, e.At, e.End)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *TableStallError) Unwrap() error { return e.Err }
