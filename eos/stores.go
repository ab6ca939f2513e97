package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/changelog"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/topiccheck"
	"github.com/eoskit/eoskit/state"
)

// keyedState is a stateful processor's stores, one per input partition it
// handles, and what each transaction wrote to them. The processor's loop
// alone opens, ends and closes them, between transactions, and starts
// their restores (run in the background, see restores.go); the group's
// callbacks only mark partitions assigned or taken (and pause an
// assigned one), and readers ([StateView]) read the committed stores
// under mu.
//
// The lifecycle of a partition's store:
//   - assigned (the group's callback): marked for a restore, and its
//     fetching paused;
//   - at the loop's next prepare, between transactions: opened if need be
//     and restored from the changelog's tail (from the store's
//     checkpoint; a memory store has none, so the whole changelog) in the
//     background, while the partitions restored go on (restores.go); then
//     fetched again;
//   - handled: each handler call writes through a [state.Scope], kept in
//     the partition's [state.Txn] if the call succeeded;
//   - before the transaction ends (flush): each Txn's writes produced to
//     the changelog partition of the same number (and to the updates
//     topic), in the transaction;
//   - after it ended (ended): applied to the store if it committed, else
//     dropped;
//   - revoked or lost: set aside (parked) once the transaction under way
//     ended; if the group gives it back soon (an eager rebalance revokes
//     every partition, then assigns most back), its store is restored
//     from its checkpoint, the changelog's tail only, rather than opened
//     and restored anew; else closed.
type keyedState struct {
	cfg    *stateConfig
	input  string
	logger *slog.Logger
	// restored reports each partition's restore (the processor's
	// metrics), keys finds a key's partition (the views'): set by
	// NewProcessor.
	restored func(partition int32, r changelog.Result)
	keys     *keyLocator
	// joins are the co-partitioned tables followed (set by
	// NewProcessor); owners, given an Endpoint, learns which member
	// holds each partition.
	joins  *joinedTables
	owners *owners

	// wake ends the loop's idle poll (set by NewProcessor): a background
	// restore returned.
	wake func()

	// Set by open, for a session: the restorer, the session's client
	// (which fetches a restored partition again), and the context of
	// its background restores.
	restorer  *changelog.Restorer
	cl        *kgo.Client
	bgCtx     context.Context
	bgCancel  context.CancelFunc
	maxRecord int

	// partitions is how many partitions the input had when Run checked
	// the changelog against it.
	partitions atomic.Int32
	// headers is the most a record produced has carried in headers the
	// producer's hooks added (kotel's traceparent): the stores' writes
	// must leave room for it (see learnHeaders).
	headers atomic.Int64

	mu        sync.RWMutex
	parts     map[int32]*partState
	restoring map[int32]bool
	// parked holds the stores of partitions taken away (see the
	// lifecycle above), standbys those kept warm for partitions others
	// own (see Standbys).
	parked   map[int32]parkedStore
	standbys map[int32]*standby

	marksMu sync.Mutex
	// tasks are the background restores under way, queued those waiting
	// for one of maxParallelRestores; bgErr the first that failed (see
	// restores.go).
	tasks   map[int32]*restoreTask
	queued  []restoreJob
	bgErr   error
	bgWG    sync.WaitGroup // the restore goroutines (stopRestores waits)
	restore map[int32]bool // assigned since the last prepare
	taken   map[int32]bool // revoked or lost since the last ended
	// takenAt is the assignments' count when each partition of taken
	// was taken (see parkedStore).
	takenAt map[int32]int64
	// assignments counts the group's assignments, so that a transaction
	// stops polling more records once one came (see moreAssigned); the
	// group's callback also wakes the poll under way (idleWake), so that
	// an idle instance restores what it was given.
	assignments atomic.Int64

	// errMu guards err: the first failure of the transaction under way
	// that is not a record's (a changelog record not written, a restore
	// that failed), which turns its commit into an abort.
	errMu sync.Mutex
	err   error
}

// partState is one input partition's store and the transaction's writes
// over it.
type partState struct {
	store state.Store
	txn   *state.Txn
	// last is the offset of the last changelog record of the transaction
	// under way (-1: none), which the store's checkpoint passes once the
	// transaction committed.
	last atomic.Int64
	// clock is the partition's stream time as txn sees it (see
	// streamClock); abort forgets it with txn's writes.
	clock clockMemo
}

// abort drops the transaction's writes, and what the clock remembered of
// them.
func (ps *partState) abort() {
	ps.txn.Abort()
	ps.clock.forget()
}

func newKeyedState(cfg *stateConfig, input string, logger *slog.Logger) *keyedState {
	return &keyedState{cfg: cfg, input: input, logger: logger,
		parts: map[int32]*partState{}, restoring: map[int32]bool{}, parked: map[int32]parkedStore{}, standbys: map[int32]*standby{},
		restore: map[int32]bool{}, taken: map[int32]bool{}, takenAt: map[int32]int64{}, tasks: map[int32]*restoreTask{}}
}

// check refuses a changelog that does not fit the input (see Changelog),
// and learns the changelog's record limit.
func (ks *keyedState) check(ctx context.Context, conn []kgo.Opt, inputPartitions int32) error {
	sh, err := changelog.Check(ctx, conn, ks.cfg.changelog, inputPartitions, changelog.CheckOptions{
		Create: ks.cfg.create, RequireConfigs: ks.cfg.requireConfigs, Logger: ks.logger})
	if err != nil {
		return err
	}
	// A record larger than the producer's batch limit for the topic
	// fails in franz-go (MessageTooLarge) whatever the topic allows.
	ks.maxRecord = min(sh.MaxMessageBytes, ks.cfg.recordLimit(ks.cfg.changelog))
	if ks.cfg.limits != nil {
		ks.cfg.limits.learn(ks.cfg.changelog, sh.MaxMessageBytes)
	}
	ks.partitions.Store(inputPartitions)
	return nil
}

// recordLimit is what a store's write may take of the changelog's record
// limit: all but what the producer's hooks add to every record.
func (ks *keyedState) recordLimit() int {
	if ks.maxRecord <= 0 {
		return 0
	}
	return max(1, ks.maxRecord-int(ks.headers.Load()))
}

// learnHeaders notes the headers the producer's hooks added to a record,
// and when they take more room than seen before, lowers every store's
// limit for the writes to come: a write that would fit only without them
// then fails in its handler (the record's fault) rather than at the
// flush (a session restarted, for good). The first record the hooks grow
// can still fail at the flush: its session restarts once.
func (ks *keyedState) learnHeaders(hs []kgo.RecordHeader) {
	n := int64(0)
	for _, h := range hs {
		n += int64(len(h.Key)+len(h.Value)) + 10 // the varints of both lengths, at most
	}
	for cur := ks.headers.Load(); n > cur; cur = ks.headers.Load() {
		if ks.headers.CompareAndSwap(cur, n) {
			for _, ps := range ks.parts { // ks.mu is held (flush)
				ps.txn.SetMaxRecordBytes(ks.recordLimit())
			}
			ks.logger.Info("eos: the producer's hooks add headers to every record; leaving room for them in state writes", "bytes", n)
			return
		}
	}
}

// grown is the error of a partition p of the input assigned past the
// partitions Run found (and sized the changelog by): partitions were
// added to the input.
func (ks *keyedState) grown(p int32) error {
	if p < ks.partitions.Load() {
		return nil
	}
	return &eoskit.ConfigError{Package: "eos", Setting: "Changelog", Semantics: checkedAgainst(ExactlyOnce),
		Reason: fmt.Sprintf("the input topic %q grew to at least %d partitions (partition %d was assigned), while its changelog %q has %d: keyed state lives per input partition, "+
			"and partitions added move keys to partitions whose stores never saw them (a count would start again at zero). Stop every processor of the group, then re-key the state: "+
			"a new input topic of the partitions wanted, with a changelog of as many, fed from the old one", ks.input, p+1, p, ks.cfg.changelog, ks.partitions.Load())}
}

// open starts a session on cl: a restorer of its own (read_committed raw
// fetches) on conn. The previous session closed every store, so each
// partition is restored before it is handled in this one: that session
// may have ended on a commit whose outcome it did not learn.
func (ks *keyedState) open(conn []kgo.Opt, cl *kgo.Client) error {
	r, err := changelog.NewRestorer(conn)
	if err != nil {
		return fmt.Errorf("eos: changelog restorer: %w", err)
	}
	ks.mu.Lock()
	ks.restorer, ks.cl = r, cl
	ks.mu.Unlock()
	ks.marksMu.Lock()
	ks.bgCtx, ks.bgCancel = context.WithCancel(context.Background())
	ks.bgErr = nil
	ks.marksMu.Unlock()
	ks.takeErr()
	return nil
}

// close ends a session: the transaction under way dropped, every store
// closed (a pebble store keeps its checkpoint on disk).
func (ks *keyedState) close() {
	ks.stopRestores()
	ks.mu.Lock()
	defer ks.mu.Unlock()
	for p, ps := range ks.parts {
		ks.closeLocked(p, ps)
	}
	ks.closeParkedLocked(func(int32, parkedStore) bool { return true })
	clear(ks.restoring) // a restore that failed leaves its mark
	// The next session's group assigns anew: no mark of this one's may
	// open a store there.
	ks.marksMu.Lock()
	clear(ks.restore)
	clear(ks.taken)
	clear(ks.takenAt)
	ks.marksMu.Unlock()
	if ks.restorer != nil {
		ks.restorer.Close()
		ks.restorer, ks.cl = nil, nil
	}
}

// assigned and taken are the group's callbacks' part: marks the loop acts
// on between transactions.
func (ks *keyedState) assigned(cl *kgo.Client, ps []int32) {
	if len(ps) == 0 {
		return // nothing to restore: the transaction in flight goes on
	}
	ks.assignments.Add(1)
	ks.marksMu.Lock()
	defer ks.marksMu.Unlock()
	for _, p := range ps {
		ks.restore[p] = true
		delete(ks.taken, p)
		ks.cancelRestoreLocked(p) // another owner may have written since: restored again
		ks.unqueueLocked(p)
	}
	// Paused with the marks set, under marksMu: a resume decided under it
	// (resumeIfDone) comes wholly before or after (franz-go's pause and
	// resume take only locks of their own).
	ks.pause(cl, ps)
}

func (ks *keyedState) takenAway(ps []int32) {
	ks.marksMu.Lock()
	defer ks.marksMu.Unlock()
	for _, p := range ps {
		ks.taken[p] = true
		ks.takenAt[p] = ks.assignments.Load()
		delete(ks.restore, p)
		ks.cancelRestoreLocked(p)
		ks.unqueueLocked(p)
	}
}

// prepare makes the stores ready. Between transactions (between), after
// every poll (so that an idle instance's view is ready too): the stores of
// partitions taken away are parked (and those parked too long, or not
// given back by an assignment since, closed); those of partitions
// assigned since are opened (or taken back from the parked ones) and
// restored in the background (restores.go), their records unfetched
// meanwhile, while the others' records are handled. The polled
// partitions' stores are made ready here, before their records are
// handled: opened and restored if never restored in this session (or
// assigned again as their records came), or waited for if a background
// restore holds them; then the co-partitioned tables fetched for the
// records polled. Inside a transaction (collect's later polls), only the
// polled partitions: a restore there counts against the transaction. A
// restore that makes no progress for RestoreTimeout is a
// *state.RestoreError naming the partition, returned here (a background
// one at the next prepare). quiesce, if not nil, runs before a restore
// here: lanes fed across polls wait there for their handlers, so that a
// store is never restored beside handlers using it.
func (ks *keyedState) prepare(ctx context.Context, fetches kgo.Fetches, between bool, quiesce func()) error {
	var polled []int32
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) > 0 && p.Topic == ks.input {
			polled = append(polled, p.Partition)
		}
	})
	slices.Sort(polled)
	if err := ks.holdPolled(ctx, polled, between); err != nil {
		return err
	}
	if between {
		if err := ks.restoreFailed(); err != nil {
			return err
		}
	}
	var background []int32
	if between {
		ks.marksMu.Lock()
		for p := range ks.restore {
			if !slices.Contains(polled, p) && !ks.taken[p] && !ks.runningLocked(p) {
				background = append(background, p)
			}
		}
		ks.marksMu.Unlock()
		slices.Sort(background)
		ks.mu.Lock()
		ks.closeTakenLocked(polled)
		ks.marksMu.Lock()
		ks.closeStaleParkedLocked()
		ks.marksMu.Unlock()
		ks.mu.Unlock()
	}
	todo, err := ks.openForRestore(polled, polled)
	if err != nil {
		return err
	}
	if len(todo) > 0 {
		if quiesce != nil {
			quiesce()
		}
		ks.adopt(todo)
		if err := ks.restoreAll(ctx, todo); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
	if len(background) > 0 {
		jobs, err := ks.openForRestore(background, polled)
		if err != nil {
			return err
		}
		ks.adopt(jobs)
		ks.startRestores(jobs)
	}
	return ks.prepareJoins(ctx, fetches, polled, between)
}

// openForRestore opens (or takes back, see openStore) the stores of the
// partitions of ps that must be restored: assigned since their last
// restore, or without a store in this session; each marked restoring
// (the views and Health show it so until its restore succeeded; a failed
// one leaves it so until the session's stores close). A partition taken
// away meanwhile, and not among polled, is skipped. On an error, the
// stores opened before it are adopted (the session's end closes them).
func (ks *keyedState) openForRestore(ps, polled []int32) ([]restoreJob, error) {
	var todo []restoreJob
	for _, p := range ps {
		ks.marksMu.Lock()
		again := ks.restore[p]
		gone := ks.taken[p] && !slices.Contains(polled, p) // taken while an earlier one restored
		if gone {
			delete(ks.restore, p)
		}
		ks.marksMu.Unlock()
		if gone {
			continue
		}
		ks.mu.Lock()
		st := ks.parts[p]
		if st != nil && !again {
			ks.mu.Unlock()
			continue
		}
		ks.restoring[p] = true
		ks.marksMu.Lock()
		delete(ks.restore, p)
		ks.marksMu.Unlock()
		ks.mu.Unlock()
		if st == nil {
			if err := ks.grown(p); err != nil {
				ks.adopt(todo)
				return nil, err
			}
			s, err := ks.openStore(p)
			if err != nil {
				// A store another owner still holds (a pebble
				// directory's lock) or a passing failure: a new session
				// tries again (the stores opened before this one close
				// with the session's).
				ks.adopt(todo)
				return nil, loop.Restart(fmt.Errorf("open the store of %s[%d]: %w", ks.cfg.changelog, p, err))
			}
			st = &partState{store: s, txn: state.NewTxn(s, ks.recordLimit())}
			st.last.Store(-1)
		}
		todo = append(todo, restoreJob{p, st})
	}
	return todo, nil
}

// inTxnTableWait bounds how long a poll inside a transaction waits for a
// co-partitioned table (between transactions, TableRestoreTimeout does):
// the transaction's timeout runs meanwhile.
const inTxnTableWait = 2 * time.Second

// restoreJob is a partition whose store a prepare restores.
type restoreJob struct {
	p  int32
	ps *partState
}

// maxParallelRestores bounds how many partitions restore at once: each
// reads its changelog partition with fetches of its own (to its leader),
// and applies them to its own store.
const maxParallelRestores = 4

// adopt puts the stores of todo in parts: where the views find them once
// restored, and where the session's end closes them. Each store is about
// to be restored (or closed): what the memo of a store open again
// remembered is forgotten, here, where no lane handles its records any
// more (prepare quiesced them; a lane's call kept before would fill it
// again). openForRestore's failures adopt what they opened before the
// lanes are quiet; the transaction then fails, and its abort forgets the
// memos again once the lanes are done.
func (ks *keyedState) adopt(todo []restoreJob) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	for _, j := range todo {
		j.ps.clock.forget()
		ks.parts[j.p] = j.ps
	}
}

// restoreAll restores the jobs' stores from the changelog, up to
// maxParallelRestores at once, and waits for them; as each restore
// succeeds, its partition is reported, then marked restored and fetched
// again, unless a failure or ctx's end cancelled the restores meanwhile
// (the session ends then). The first failure cancels the others and is
// returned.
func (ks *keyedState) restoreAll(ctx context.Context, todo []restoreJob) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan error, len(todo))
	next, running := 0, 0
	var first error
	for next < len(todo) || running > 0 {
		for ; next < len(todo) && running < maxParallelRestores && first == nil; next++ {
			j := todo[next]
			running++
			go func() {
				res, err := ks.restorer.Restore(ctx, ks.cfg.changelog, j.p, j.ps.store, changelog.Options{Timeout: ks.cfg.restoreTimeout, Logger: ks.logger})
				if err == nil {
					ks.report(ctx, j.p, res)
					ks.mu.Lock()
					ks.marksMu.Lock()
					if ctx.Err() == nil { // as runRestore: never readable unreported
						delete(ks.restoring, j.p)
						ks.resumeIfDoneLocked(j.p)
					}
					ks.marksMu.Unlock()
					ks.mu.Unlock()
				}
				done <- err
			}()
		}
		if running == 0 {
			break // a failure stopped the starts
		}
		err := <-done
		running--
		if err != nil && first == nil {
			first = err
			cancel(err)
		}
	}
	if first != nil {
		return first
	}
	return ctx.Err()
}

// prepareJoins has each co-partitioned table (see JoinTable) fetch what
// the polled partitions' records may meet, from the position committed in
// their stores, before the handlers run.
func (ks *keyedState) prepareJoins(ctx context.Context, fetches kgo.Fetches, polled []int32, between bool) error {
	if ks.joins == nil || len(polled) == 0 || !ks.joins.following() {
		return nil
	}
	latest := map[int32]time.Time{}
	fetches.EachPartition(func(fp kgo.FetchTopicPartition) {
		if fp.Topic != ks.input {
			return
		}
		for _, r := range fp.Records {
			if r.Timestamp.After(latest[fp.Partition]) {
				latest[fp.Partition] = r.Timestamp
			}
		}
	})
	var err error
	ks.joins.each(func(f *tableFollower) {
		for _, p := range polled {
			if err != nil {
				return
			}
			ks.mu.RLock()
			ps := ks.parts[p]
			ks.mu.RUnlock()
			if ps == nil {
				continue // taken away meanwhile: not handled
			}
			wait := f.wait
			if !between {
				wait = min(wait, inTxnTableWait)
			}
			var pos, at int64
			var id kadm.TopicID
			if id, err = tableTopicID(ps.store, f.topic); err != nil {
				return
			}
			if err = f.sameTopic(p, id); err != nil {
				return
			}
			if pos, err = tablePosition(ps.store, f.topic, f.keys.position); err != nil {
				return
			}
			if at, err = tablePosition(ps.txn, f.topic, f.keys.position); err != nil {
				return
			}
			err = f.prepare(ctx, p, pos, at, latest[p], wait)
		}
	})
	return err
}

// moreAssigned reports whether the group assigned partitions since
// assignments was at since: a transaction then stops polling, so that the
// next one's prepare restores them before their records are handled.
func (ks *keyedState) moreAssigned(since int64) bool { return ks.assignments.Load() != since }

// fail notes err as the transaction's failure: the first one counts,
// but a refused state record replaces any other but a fencing (a refused
// partition's siblings fail too, OPERATION_NOT_ATTEMPTED, maybe first),
// so that Run names the ACL rather than restarting.
func (ks *keyedState) fail(err error) {
	ks.errMu.Lock()
	defer ks.errMu.Unlock()
	if ks.err == nil || (refusedStateWrite(err) != nil && refusedStateWrite(ks.err) == nil && !isFenced(ks.err)) {
		ks.err = err
	}
}

// takeErr returns the transaction's failure, and forgets it.
func (ks *keyedState) takeErr() error {
	ks.errMu.Lock()
	defer ks.errMu.Unlock()
	err := ks.err
	ks.err = nil
	return err
}

// txn returns partition p's transaction, over which a handler call on a
// record of p gets a Scope, and its stream time memo.
func (ks *keyedState) txn(p int32) (*state.Txn, *clockMemo) {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	ps := ks.parts[p]
	return ps.txn, &ps.clock
}

// flush produces each partition's changes of this transaction: to the
// changelog partition of the same number, and to the updates topic if
// any. produce must call each record's promise once; a record that
// failed is the transaction's failure (takeErr).
func (ks *keyedState) flush(ctx context.Context, produce func(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error))) {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	failed := func(r *kgo.Record, err error) {
		ks.fail(&stateWriteError{topic: r.Topic, partition: r.Partition, err: err})
	}
	for _, p := range slices.Sorted(maps.Keys(ks.parts)) {
		ps := ks.parts[p]
		dirty := ps.txn.Dirty()
		if len(dirty) == 0 {
			continue
		}
		for _, w := range dirty {
			r := &kgo.Record{Topic: ks.cfg.changelog, Partition: p, Key: w.Key, Value: w.Value, Context: ctx}
			produce(ctx, r, func(r *kgo.Record, err error) {
				if err != nil {
					failed(r, err)
					return
				}
				for last := ps.last.Load(); r.Offset > last && !ps.last.CompareAndSwap(last, r.Offset); last = ps.last.Load() {
				}
			})
			// The producer's hooks ran in produce: what they added is
			// in r.Headers now (a changelog record is made with none).
			ks.learnHeaders(r.Headers)
		}
		if ks.cfg.updates != "" {
			for _, r := range state.Updates(dirty, ks.cfg.updates) {
				r.Context = ctx
				produce(ctx, r, func(r *kgo.Record, err error) {
					if err != nil {
						failed(r, err)
					}
				})
				ks.learnHeaders(r.Headers) // the hooks may add to these alone
			}
		}
	}
}

// stateWriteError is a changelog or updates record that was not written:
// the transaction's failure, not a record's (a write too large for either
// topic failed in its handler, see check).
type stateWriteError struct {
	topic     string
	partition int32
	err       error
}

func (e *stateWriteError) Error() string {
	return fmt.Sprintf("eos: state record to %s[%d] not written: %v", e.topic, e.partition, e.err)
}

func (e *stateWriteError) Unwrap() error { return e.err }

// refusedStateWrite returns the state record in err that the broker
// refused for want of an ACL, or nil.
func refusedStateWrite(err error) *stateWriteError {
	if sw, ok := errors.AsType[*stateWriteError](err); ok && authz.Refused(sw.err) {
		return sw
	}
	return nil
}

// ended applies each partition's writes to its store if the transaction
// committed, and drops them otherwise; then closes the stores of the
// partitions taken away meanwhile. A store that fails to apply is closed
// too: its partition is restored before it is handled again.
func (ks *keyedState) ended(committed bool) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	for p, ps := range ks.parts {
		last := ps.last.Swap(-1)
		switch {
		case !committed:
			ps.abort()
			continue
		case last < 0 && ps.txn.Len() > 0:
			// Committed with writes but no changelog record: never
			// (the loop flushes before every commit), but if so the
			// store must not take them without their changelog.
			ks.logger.Error("eos: a transaction committed writes without their changelog records; the partition is restored from the changelog",
				"partition", p)
			ks.closeLocked(p, ps)
			continue
		case last < 0:
			continue
		}
		if err := ps.txn.Commit(last + 1); err != nil {
			ks.logger.Warn("eos: applying a committed transaction to a partition's store failed; it is restored from the changelog before its next record",
				"partition", p, "err", err)
			ks.closeLocked(p, ps)
		}
	}
	ks.closeTakenLocked(nil)
}

// closeTakenLocked parks the stores of the partitions taken away, but
// those of keep (records of which were polled: a transaction may still
// hold them, and ended parks them after it) and those whose background
// restore has not returned yet (a later call parks them), and forgets
// their marks (ks.mu held).
func (ks *keyedState) closeTakenLocked(keep []int32) {
	ks.marksMu.Lock()
	defer ks.marksMu.Unlock()
	parked := false
	for p := range ks.taken {
		if slices.Contains(keep, p) || ks.runningLocked(p) {
			continue // a background restore, cancelled, returns first
		}
		delete(ks.taken, p)
		ks.unqueueLocked(p)
		if ps, ok := ks.parts[p]; ok {
			ps.abort()
			delete(ks.parts, p)
			delete(ks.restoring, p) // its restore was cancelled: the next assignment restores it
			ks.parked[p] = parkedStore{store: ps.store, assignments: ks.takenAt[p], until: time.Now().Add(parkFor)}
			parked = true
		}
		delete(ks.takenAt, p)
	}
	if parked {
		ks.noteWarmLocked()
	}
}

// tablesClosed tells the co-partitioned tables that p's store closed: its
// table buffers go.
func (ks *keyedState) tablesClosed(p int32) {
	if ks.joins != nil {
		ks.joins.each(func(f *tableFollower) { f.closed(p) })
	}
}

// parkedStore is the store of a partition taken away, kept for a while
// should the group give the partition back.
type parkedStore struct {
	store state.Store
	// assignments is the group's assignments' count when it was taken
	// away; until is when it is closed at the latest.
	assignments int64
	until       time.Time
}

// parkFor is how long a partition's store is kept once taken away: an
// eager rebalance's assignment comes within the rebalance timeout (60 s by
// default), and an assignment that does not give it back closes it at once.
const parkFor = time.Minute

// openStore returns the store p's restore takes up: the one parked when
// p was taken away, or the standby kept warm for it (each restores from
// its checkpoint), else a new one from the factory.
func (ks *keyedState) openStore(p int32) (state.Store, error) {
	ks.mu.Lock()
	pk, parked := ks.parked[p]
	delete(ks.parked, p)
	ks.noteWarmLocked()
	ks.mu.Unlock()
	if parked {
		return pk.store, nil
	}
	if s, ok := ks.takeStandby(p); ok {
		return s, nil
	}
	return ks.cfg.stores(ks.cfg.changelog, p)
}

// closeParkedLocked closes the parked stores close says to (ks.mu held).
func (ks *keyedState) closeParkedLocked(close func(int32, parkedStore) bool) {
	closed := false
	defer func() {
		if closed {
			ks.noteWarmLocked()
		}
	}()
	for p, pk := range ks.parked {
		if !close(p, pk) {
			continue
		}
		closed = true
		delete(ks.parked, p)
		ks.tablesClosed(p)
		if err := pk.store.Close(); err != nil {
			ks.logger.Warn("eos: closing a partition's store failed", "partition", p, "err", err)
		}
	}
}

// closeStaleParkedLocked closes the parked stores the group did not give
// back: an assignment came since without them, or they waited parkFor
// (ks.mu and marksMu held).
func (ks *keyedState) closeStaleParkedLocked() {
	now, assignments := time.Now(), ks.assignments.Load()
	ks.closeParkedLocked(func(p int32, pk parkedStore) bool {
		return !ks.restore[p] && (assignments != pk.assignments || now.After(pk.until))
	})
}

// closeLocked drops p's transaction and closes its store (ks.mu held).
func (ks *keyedState) closeLocked(p int32, ps *partState) {
	ps.abort()
	delete(ks.parts, p)
	ks.tablesClosed(p)
	if err := ps.store.Close(); err != nil {
		ks.logger.Warn("eos: closing a partition's store failed", "partition", p, "err", err)
	}
}

// restoringNow lists the partitions being restored, or assigned and
// waiting for their restore (not those taken away meanwhile: their new
// owner restores them).
func (ks *keyedState) restoringNow() []int32 {
	ks.mu.RLock()
	defer ks.mu.RUnlock()
	ks.marksMu.Lock()
	defer ks.marksMu.Unlock()
	var ps []int32
	for p := range ks.restoring {
		if !ks.taken[p] {
			ps = append(ps, p)
		}
	}
	for p := range ks.restore {
		if !ks.restoring[p] {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// keyLocator finds a key's input partition for the views: the
// partitioner's topic partitioner for the input, used one call at a time.
type keyLocator struct {
	mu    sync.Mutex
	input string
	p     kgo.Partitioner
	// tp and keyed (whether tp places records by key) are made at the
	// first call.
	tp    kgo.TopicPartitioner
	keyed bool
}

func (l *keyLocator) partition(key []byte, n int32) (int32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tp == nil {
		l.tp = l.p.ForTopic(l.input)
		l.keyed = keyConsistent(l.tp)
	}
	if !l.keyed {
		return 0, errors.New("eos: the processor's partitioner does not place records by key: give RequireKeyPartitioning the input's")
	}
	p := partitionOf(l.tp, &kgo.Record{Topic: l.input, Key: key}, int(n))
	if p < 0 || p >= int(n) {
		return 0, fmt.Errorf("eos: the partitioner put key in partition %d of %d", p, n)
	}
	return int32(p), nil
}

// unreadyLocked reports whether p's store is not to be read: restoring,
// assigned since its last restore (another owner may have changed it),
// or taken away (its new owner may be changing it). ks.mu is held.
func (ks *keyedState) unreadyLocked(p int32) bool {
	restoring, taken := ks.marksLocked(p)
	return restoring || taken
}

// heldLocked returns p's store for a view's read, or why it cannot be
// read: not held here, or unready (see unreadyLocked); Restoring only
// for a partition not taken away meanwhile (its new owner answers then).
// ks.mu is held.
func (ks *keyedState) heldLocked(p int32) (*partState, error) {
	ps, ok := ks.parts[p]
	restoring, taken := ks.marksLocked(p)
	if !ok || restoring || taken {
		return nil, &NotHeldError{Partition: p, Restoring: restoring && !taken}
	}
	return ps, nil
}

// marksLocked reports whether p restores here (or waits to) and whether
// it was taken away: ks.mu is held.
func (ks *keyedState) marksLocked(p int32) (restoring, taken bool) {
	ks.marksMu.Lock()
	defer ks.marksMu.Unlock()
	return ks.marksOf(p)
}

// marksOf is marksLocked with marksMu held.
func (ks *keyedState) marksOf(p int32) (restoring, taken bool) {
	return ks.restoring[p] || ks.restore[p], ks.taken[p]
}

// checkChangelog refuses, at Run, a changelog that does not fit the input
// (see Changelog); nothing without state.
func (p *Processor) checkChangelog(ctx context.Context) error {
	if p.state == nil {
		return nil
	}
	input := p.state.input
	tds, err := topiccheck.Describe(ctx, p.cfg.connOpts(), input)
	if err != nil {
		return fmt.Errorf("eos: describe the input topic %q: %w", input, err)
	}
	td, ok := tds[input]
	switch {
	case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
		return &eoskit.ConfigError{Package: "eos", Setting: "Topics", Semantics: checkedAgainst(p.cfg.semantics),
			Reason: fmt.Sprintf("the input topic %q of a stateful processor does not exist: its partition count sizes the changelog", input)}
	case td.Err != nil:
		return fmt.Errorf("eos: describe the input topic %q: %w", input, td.Err)
	}
	if err := p.state.check(ctx, p.cfg.connOpts(), int32(len(td.Partitions))); err != nil {
		return err
	}
	if u := p.state.cfg.updates; u != "" {
		missing, err := topiccheck.Missing(ctx, p.cfg.connOpts(), u)
		if err != nil {
			return fmt.Errorf("eos: look up the updates topic %q: %w", u, err)
		}
		if missing >= 0 {
			return &eoskit.ConfigError{Package: "eos", Setting: "EmitUpdates", Semantics: checkedAgainst(p.cfg.semantics),
				Reason: fmt.Sprintf("the updates topic %q does not exist: create it (eos creates no topics but the changelog, on request)", u)}
		}
		// Its records are the changelog's: a write must fit both, and
		// one too large fails in its handler, the record's fault.
		limit, err := changelog.RecordLimit(ctx, p.cfg.connOpts(), u)
		switch {
		case err == nil:
			p.state.maxRecord = min(p.state.maxRecord, limit, p.state.cfg.recordLimit(u))
			if p.state.cfg.limits != nil {
				p.state.cfg.limits.learn(u, limit)
			}
		case !authz.Refused(err):
			return fmt.Errorf("eos: describe the configs of the updates topic %q: %w", u, err)
		case p.state.cfg.requireConfigs:
			return &eoskit.AuthorizationError{Permission: "DescribeConfigs on topic " + u, Err: err}
		default:
			p.logger.Warn("eos: may not describe the updates topic's configs: Kafka's default record limit is assumed for it; grant DescribeConfigs on the topic to verify it",
				"topic", u, "assumed_max_message_bytes", changelog.DefaultMaxMessageBytes)
			p.state.maxRecord = min(p.state.maxRecord, changelog.DefaultMaxMessageBytes, p.state.cfg.recordLimit(u))
			if p.state.cfg.limits != nil {
				p.state.cfg.limits.learn(u, changelog.DefaultMaxMessageBytes)
			}
		}
	}
	return nil
}

// prepareState runs the keyed state's prepare between transactions;
// nothing without state, and nil once ctx ended (a shutdown).
func (p *Processor) prepareState(ctx context.Context, fetches kgo.Fetches) error {
	if p.state == nil {
		return nil
	}
	if err := p.state.prepare(ctx, fetches, true, nil); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// partitionCount is the input's partition count, 0 before Run's check.
func (ks *keyedState) partitionCount() int32 { return ks.partitions.Load() }
