package consume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/loop"
)

// Runner is what a database runner supplies to the core.
type Runner struct {
	// Owned maps kgo options the runner sets itself, beyond the
	// group's and topics', to the runner option to use instead: they
	// are refused in ClientOptions.
	Owned map[string]string
	// Seek positions every assigned partition (kgo's
	// AdjustFetchOffsetsFn): offsetstore's stored offsets. It also
	// returns the positions it found stored (not reset points), which
	// under CommitToKafka the core copies to the group in Kafka, so that
	// a partition with no further input is not shown behind for good
	// when its last copy was lost (a crash between the database commit
	// and the copy). Nil: the group's offsets.
	Seek func(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (_ map[string]map[int32]kgo.Offset, stored map[string]map[int32]int64, _ error)
	// Check runs once per Run, before the client joins the group (a
	// store or schema that is not ready costs the group no rebalance).
	Check func(ctx context.Context) error
	// Start runs once per Run, with Run's client, before the first poll.
	Start func(ctx context.Context, cl *kgo.Client) error
	// Commit commits one batch: the records of one poll (Concurrency 1),
	// or of one partition, in offset order. It returns nil once they
	// are committed, ctx's error once ctx ended, or an error for Failed
	// (a *PartlyCommitted when it committed the records before it).
	Commit func(ctx context.Context, cl *kgo.Client, batch []*kgo.Record) error
	// Failed runs for a batch whose Commit returned an error not ctx's:
	// in the poll loop, while the poll holds the rebalance, or in the
	// revoke and lost callbacks for the partitions taken, after Taken.
	// It returns nil to go on (the batch's partitions are fetched again
	// from where the client stands: a runner that refused the batch
	// moves those it still owns first), or the error Run returns. Nil:
	// every error ends Run.
	Failed func(ctx context.Context, cl *kgo.Client, batch []*kgo.Record, err error) error
	// Taken runs in the revoke and lost callbacks, once the partitions'
	// batches ended.
	Taken func(parts map[string][]int32)
	// CommitToKafka makes the core commit to the group in Kafka the
	// offsets past every committed batch: from the poll loop every
	// KafkaCommitInterval at most, and at once in the revoke callback and
	// when Run returns (one that fails is logged and tried again).
	CommitToKafka bool
	// CommitWhat names that commit in the log.
	CommitWhat string
	// Stopped runs when Run returns.
	Stopped func()
}

// Core runs a database runner's Run.
type Core struct {
	pkg       string
	cfg       Config
	run       Runner
	userHooks loop.Hooks
	// Obs takes what the runner reports: its metrics and its health.
	Obs   *loop.Observer
	shell loop.Shell
	// topicIDs are the topics' IDs as the latest fetches named them
	// (Kafka 3.1+; none from an older broker).
	topicIDs sync.Map // topic name -> [16]byte
}

// TopicID is the ID of topic as the latest fetch of its records named it,
// zero when no fetch did (a broker older than Kafka 3.1). A record's
// dead letter is keyed by it, so that a topic deleted and created again
// under the same name parks its records beside the old topic's, not in
// their place.
func (c *Core) TopicID(topic string) [16]byte {
	id, _ := c.topicIDs.Load(topic)
	v, _ := id.([16]byte)
	return v
}

// Run consumes until ctx ends (then, after the drain, it returns nil) or
// a batch fails for good (then it returns that error once the other
// batches under way ended). It returns eoskit.ErrRunning while another Run
// of the same core runs.
func (c *Core) Run(ctx context.Context) error {
	return c.shell.Run(ctx, loop.Spec{
		Pkg: c.pkg, Obs: c.Obs, Logger: c.cfg.Logger, Drain: c.cfg.Drain,
		Start: c.start,
		Session: func(ctx, work context.Context) (bool, error) {
			return false, c.session(ctx, work)
		},
		Stopped: func(error) {
			if c.run.Stopped != nil {
				c.run.Stopped()
			}
		},
	})
}

// start checks, once per Run, before the client joins the group (a store
// or schema that is not ready costs the group no rebalance): the
// runner's own check, then the connection and the consumer protocol.
func (c *Core) start(ctx context.Context) error {
	if c.run.Check != nil {
		if err := c.run.Check(ctx); err != nil {
			return err
		}
	}
	conn := append(append([]kgo.Opt{}, c.cfg.ClientOpts...), kgo.SeedBrokers(c.cfg.Brokers...))
	return loop.StartChecks(ctx, c.pkg, conn, c.cfg.ConsumerProtocol, c.cfg.Logger)
}

// session is Run's one session: the core restarts none (a batch that
// fails for no record's fault is retried in place, see Runner.Failed).
func (c *Core) session(ctx, work context.Context) error {
	s := &session{core: c, ctx: ctx, work: work, lanes: map[tp]*lane{}, finishing: make(chan struct{})}
	if c.run.CommitToKafka {
		s.commits = loop.NewKafkaCommits(c.cfg.Logger)
	}
	if c.cfg.Concurrency > 1 {
		s.slots = make(chan struct{}, c.cfg.Concurrency)
	}
	opts := loop.GroupHooks(loop.Hooks{Assigned: s.assigned, Revoked: s.revoked, Lost: s.lost}, c.userHooks)
	if c.run.Seek != nil {
		opts = append(opts, kgo.AdjustFetchOffsetsFn(s.seek))
	}
	cl, err := c.newClient(opts...)
	if err != nil {
		return err
	}
	s.cl = cl
	// The last poll may hold a rebalance; Close alone would wait for it.
	defer cl.CloseAllowingRebalance()
	c.Obs.WatchAssignment(c.cfg.Logger.With("group", c.cfg.Group), loop.SessionTimeout(cl))
	if c.run.Start != nil {
		if err := c.run.Start(ctx, cl); err != nil {
			return err
		}
	}
	return s.loop(ctx)
}

type tp struct {
	topic     string
	partition int32
}

// session is one Run's state: its client, and the batches under way.
type session struct {
	core *Core
	cl   *kgo.Client
	// ctx is Run's: once it ended, no batch starts. work is what batches
	// commit under: it ends the drain after ctx.
	ctx, work context.Context
	// batches counts the batch goroutines, so that Run returns only
	// once none runs (one a revoke stopped waiting for included).
	batches sync.WaitGroup
	commits *loop.KafkaCommits // nil unless Runner.CommitToKafka
	// lastCommit is when the poll loop last committed to Kafka.
	lastCommit time.Time
	slots      chan struct{} // the Concurrency bound; nil under Concurrency 1

	mu    sync.Mutex
	lanes map[tp]*lane // partitions with batches not settled yet
	ended []*batch     // batches that ended, for the poll loop to settle
	// wake cuts the poll in progress short (nil between polls: a batch
	// that ends then is in ended, and a seek sets sought, which the next
	// poll checks).
	wake   context.CancelFunc
	sought bool
	// failed is the error of the first batch that failed for good: no
	// batch starts after it, and Run returns it.
	failed error
	// unsettled counts the batches that ended with an error the poll
	// loop has not settled yet (whether it is for good only Runner.Failed
	// says); no batch starts meanwhile (mayStart). settledAll is closed
	// when it is zero.
	unsettled  int
	settledAll chan struct{}
	// finishing is closed when the poll loop ended (finish): no batch
	// starts after it.
	finishing chan struct{}
}

// lane is a partition's pipeline: its batches not settled yet, the last
// one started last.
type lane struct {
	last    *batch
	pending int  // batches not settled
	paused  bool // the partition is paused (pending reached laneDepth)
}

// laneDepth is how many batches a partition holds at most: the one
// committing and the next, fetched meanwhile so that it starts at once.
// The partition is paused while it holds that many.
const laneDepth = 2

// batch is one Commit's records and how it ended.
type batch struct {
	recs []*kgo.Record
	tp   tp    // its partition, under Concurrency above 1
	lane *lane // its lane, under Concurrency above 1
	err  error
	done chan struct{} // closed when the batch ended
	// prev is the partition's batch before this one, not settled when
	// this one was started: this one commits after it, and not at all
	// if it failed. Cleared once this one ended (under session.mu), so
	// that a lane holds no chain of the batches it had.
	prev *batch
	// revoked is set (and taken closed) when the group took the
	// partition: a batch not started by then is dropped.
	revoked atomic.Bool
	taken   chan struct{}
	// unsettled: b ended with an error the poll loop has not settled
	// (session.failing). session.mu guards it.
	unsettled bool
}

// revoke marks b's partition taken. session.mu is held.
func (b *batch) revoke() {
	if b.revoked.CompareAndSwap(false, true) {
		close(b.taken)
	}
}

// errDropped ends a batch that did not start: the group took its
// partition, or the batch before it in its lane did not commit (its
// records are fetched again after it).
var errDropped = errors.New("consume: batch dropped before it started")

// loop polls and hands the records over until ctx ends or a batch failed
// for good.
func (s *session) loop(ctx context.Context) error {
	c := s.core
	refused := &authz.Watch{Group: c.cfg.Group, Grace: authz.DefaultGrace}
	for {
		fetches, stop, err := s.poll(ctx, refused)
		if stop {
			return s.finish(nil)
		}
		if err != nil {
			return s.finish(fmt.Errorf("%s: %w", c.pkg, err))
		}
		fetches.EachTopic(func(ft kgo.FetchTopic) {
			if ft.TopicID != ([16]byte{}) {
				c.topicIDs.Store(ft.Topic, ft.TopicID)
			}
		})
		if recs := fetches.Records(); len(recs) > 0 && !s.stopping() {
			if s.slots == nil {
				s.commitPoll(recs)
			} else {
				s.dispatch(recs)
			}
		}
		if err := s.settle(); err != nil {
			return s.finish(err)
		}
		s.commitToKafka(false)
		s.cl.AllowRebalance()
	}
}

// poll polls once; a batch that ends cuts the poll short (wakes it), so
// that the loop settles it at once.
func (s *session) poll(ctx context.Context, refused *authz.Watch) (kgo.Fetches, bool, error) {
	return loop.Poll(ctx, s.pollRecords, s.core.cfg.MaxPoll, s.core.Obs, s.core.cfg.Logger, refused)
}

// pollRecords polls under a context of ctx's that a batch's end cancels
// (and, while offsets wait for Kafka, that ends when they are due).
func (s *session) pollRecords(ctx context.Context, n int) kgo.Fetches {
	var pollCtx context.Context
	var cancel context.CancelFunc
	if s.commits != nil && s.commits.Pending() > 0 {
		// Offsets wait for Kafka: the poll ends when they are due,
		// records or not (the partition may stay idle).
		pollCtx, cancel = context.WithDeadline(ctx, s.lastCommit.Add(KafkaCommitInterval))
	} else {
		pollCtx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	s.mu.Lock()
	if len(s.ended) > 0 || s.sought {
		cancel()
	}
	s.wake, s.sought = cancel, false
	s.mu.Unlock()
	f := s.cl.PollRecords(pollCtx, n)
	s.mu.Lock()
	s.wake = nil
	s.mu.Unlock()
	return f
}

// commitPoll commits a poll's records as one batch, before the next poll
// (Concurrency 1).
func (s *session) commitPoll(recs []*kgo.Record) {
	b := &batch{recs: recs, done: make(chan struct{})}
	b.err = s.core.run.Commit(s.work, s.cl, recs)
	s.mu.Lock()
	s.ended = append(s.ended, b)
	close(b.done)
	s.mu.Unlock()
}

// settle takes the batches that ended, in the poll loop while the poll
// holds the rebalance: a committed batch's offsets are queued for Kafka;
// a failed one goes to Runner.Failed; a paused partition is fetched again
// once its lane has room. It returns the error Run ends with, once a
// batch failed for good; the partition of that batch stays paused.
func (s *session) settle() error {
	s.mu.Lock()
	ended := s.ended
	s.ended = nil
	s.mu.Unlock()
	defer s.settledFailures(ended)
	for _, b := range ended {
		// A batch that outlasted a revoke's wait is settled as
		// nothing (logged if it committed): its partition is another
		// member's.
		var err error
		if !b.revoked.Load() {
			err = s.outcome(s.cl, b)
		} else {
			s.committedStale(b, "after the revoke stopped waiting for it")
		}
		s.mu.Lock()
		if err != nil && s.failed == nil {
			s.failed = err
		}
		if resume := s.release(b); resume && s.failed == nil {
			s.cl.ResumeFetchPartitions(map[string][]int32{b.tp.topic: {b.tp.partition}})
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// outcome applies how b ended: what it committed has its offsets queued
// for Kafka (committed), and a failure goes to Runner.Failed (failure).
func (s *session) outcome(cl *kgo.Client, b *batch) error {
	return s.failure(cl, b, s.committed(b))
}

// committed queues for Kafka the offsets of what b committed (all of it,
// or the records before the one it stopped on: *PartlyCommitted), and
// returns b's failure, nil if it committed whole.
func (s *session) committed(b *batch) error {
	done, err := b.result()
	if s.commits != nil {
		s.commits.Add(done...)
	}
	return err
}

// result splits how b ended into the records it committed to the
// database (all of them, or those before the one it stopped on:
// *PartlyCommitted) and its failure, nil if it committed whole.
func (b *batch) result() ([]*kgo.Record, error) {
	err := b.err // b.err is read by the lane's next batch: not rewritten
	if part, ok := err.(*PartlyCommitted); ok {
		return part.Committed, part.Err
	}
	if err == nil {
		return b.recs, nil
	}
	return nil, err
}

// committedStale logs that b, a batch of a partition the group took from
// this member, committed records (lost: when the group session ended, by
// a stall past the session timeout or a coordinator error; or after a
// revoke stopped waiting for it). None of its offsets go to Kafka; the
// partition's next owner's commit step keeps the records from being
// applied twice (offsetstore's compare-and-set, dedup's claimed ids).
func (s *session) committedStale(b *batch, why string) {
	if done, _ := b.result(); len(done) > 0 {
		s.core.cfg.Logger.Warn(s.core.pkg+": a batch of a partition taken from this member committed "+why+"; none of its offsets go to Kafka, and the partition's next owner's commit step keeps its records from being applied twice",
			"topic", b.tp.topic, "partition", b.tp.partition, "first_offset", done[0].Offset, "records", len(done))
	}
}

// failure applies b's failure err (from committed): it goes to
// Runner.Failed, whose error (or, with none, err) it returns. A batch
// that ended with Run's work (it rolled back: its records are read again)
// or was dropped ends nothing; one that stopped on a record (a
// *eoskit.RecordError) ends Run with it even then, so that the stop is
// seen.
func (s *session) failure(cl *kgo.Client, b *batch, err error) error {
	switch {
	case err == nil || errors.Is(err, errDropped):
		return nil
	case s.work.Err() != nil && !errors.As(err, new(*eoskit.RecordError)):
		return nil
	case s.core.run.Failed == nil:
		return err
	default:
		return s.core.run.Failed(s.work, cl, b.recs, err)
	}
}

// PartlyCommitted is the error of a Commit that committed the first
// records of its batch and stopped on Err (offsetstore's Stop policy):
// their offsets go to Kafka as a committed batch's do, and the batch's
// error is Err, as if Commit had returned it.
type PartlyCommitted struct {
	Committed []*kgo.Record
	Err       error
}

func (e *PartlyCommitted) Error() string { return e.Err.Error() }
func (e *PartlyCommitted) Unwrap() error { return e.Err }

// release takes b out of its lane, and reports whether its partition was
// paused and now has room. s.mu is held.
func (s *session) release(b *batch) (resume bool) {
	l := b.lane
	if l == nil || s.lanes[b.tp] != l {
		return false // a poll's batch (Concurrency 1), or of a lane a revoke forgot
	}
	l.pending--
	if l.pending == 0 {
		delete(s.lanes, b.tp)
	}
	if l.paused && l.pending < laneDepth {
		l.paused = false
		return true
	}
	return false
}

// stopping reports whether a batch failed for good: Run ends, and no
// batch starts.
func (s *session) stopping() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed != nil
}

// KafkaCommitInterval is how often, at most, the poll loop commits to
// Kafka the offsets past the batches committed (Runner.CommitToKafka): a
// synchronous commit after every batch held the loop a round trip per
// batch, which under a backlog at Concurrency 12 is most of its time. A
// revoke and Run's end commit at once.
const KafkaCommitInterval = 100 * time.Millisecond

// commitToKafka commits, under Runner.CommitToKafka, the offsets past the
// batches committed so far: now, or with due, once KafkaCommitInterval
// passed since the last commit. One that fails is kept, and tried again
// at the next (the partition may stay idle: the poll ends in time).
func (s *session) commitToKafka(now bool) {
	if s.commits == nil || !now && time.Since(s.lastCommit) < KafkaCommitInterval {
		return
	}
	s.lastCommit = time.Now()
	_ = s.commits.Commit(s.work, s.cl, s.core.run.CommitWhat)
}

// finish ends Run, with err (nil once ctx ended): no batch starts any
// more; those under way end (under the drain once ctx ended) and are
// settled, and the offsets of those that committed go to Kafka. The error
// of a batch that failed for good wins over err; once Run's work ended,
// Run returns nil (what did not commit rolled back, and is read again),
// unless a batch stopped on a record: its *eoskit.RecordError.
func (s *session) finish(err error) error {
	close(s.finishing)
	s.mu.Lock()
	last := make([]*batch, 0, len(s.lanes))
	for _, l := range s.lanes {
		last = append(last, l.last)
	}
	s.mu.Unlock()
	for _, b := range last {
		<-b.done // and so the lane's batches before it
	}
	// And those of lanes a revoke forgot, which run under work too.
	s.batches.Wait()
	if failed := s.settle(); failed != nil {
		err = failed
	}
	s.commitToKafka(true)
	if s.work.Err() != nil && !errors.As(err, new(*eoskit.RecordError)) {
		return nil
	}
	return err
}
