package eos

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/loop"
)

// Lanes fed across polls (under [Concurrency] above 1).
//
// franz-go fills a poll partition by partition, so with a backlog one poll
// holds one partition's buffered records (thousands). Handing a whole poll
// to the lanes and waiting for all of them before the next poll ran one
// lane at a time. Instead, a batch's poller (collectFed) hands each poll's
// records to their lanes, which run on, and polls again: a partition whose
// lanes hold what they can handle before the commit interval ends is
// paused (kgo.Client.PauseFetchPartitions, which also drops what franz-go
// buffered of it), so that the next poll takes the other partitions'
// records; a lane that runs dry resumes its partition while time is left.
// Polls are sized so that no lane takes more than it can handle by the end
// of the interval (quota): the transaction still covers exactly what was
// polled into it, and it ends about when the interval does. At the end
// the poller stops, waits for the lanes, and resumes what it paused.

// pauser is what a feed needs of the client: *kgo.Client.
type pauser interface {
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
}

// laneKey names a lane: an input partition, and under KeyOrder a key's
// hash modulo keyLanesPerSlot times the bound (records without a key
// share lane 0).
type laneKey struct {
	tp  topicPartition
	key uint32
}

// keyLanesPerSlot spreads a partition's keys (KeyOrder) over this many
// lanes per handler the bound lets run at once: a transaction ends when
// its busiest lane is done, and hashing leaves lanes uneven, so shorter
// lanes end closer together (the bound still caps the handlers at once).
const keyLanesPerSlot = 4

// lane is a queue of records one goroutine handles in order; running says
// whether that goroutine is under way, and handled how many records it
// handled in the batch (only that goroutine uses it).
type lane struct {
	queue   []*kgo.Record
	running bool
	handled int
}

// fedPartition is what a feed knows of an input partition: its records
// given to lanes and not yet done, and whether the feed paused it.
type fedPartition struct {
	pending int
	paused  bool
}

// feed is one batch's lanes. The poller (collectFed) dispatches records
// to it; lanes run them under the Concurrency bound (slots).
type feed struct {
	rn        *runner
	ctx, hctx context.Context
	b         *batch
	cfg       *config
	// deadline is the end of the batch's commit interval, or later while
	// the busiest lane's records last longer (extend), at most until
	// last. Only the poller sets it, under mu.
	deadline, last time.Time
	slots          chan struct{}
	// failed is set once a record ends the batch; stop then ends the
	// poll under way.
	failed atomic.Bool
	stop   context.CancelFunc
	// progress wakes the poller when a lane finished a record.
	progress chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex // guards the fields below
	lanes   map[laneKey]*lane
	parts   map[topicPartition]*fedPartition
	pending int // records dispatched and not done, over all lanes
	polled  int // records dispatched
}

// lanesPerPartition is how many handlers may run one partition's records
// at once: 1 under PartitionOrder, the bound under KeyOrder.
func (c *config) lanesPerPartition() int {
	if c.order == KeyOrder {
		return c.concurrency
	}
	return 1
}

// dispatch hands a poll's records to their lanes, starting the lanes not
// running, and pauses each partition whose lanes now hold what they can
// handle before the deadline. Only the poller calls it.
func (f *feed) dispatch(fetches kgo.Fetches) {
	f.b.noteEnds(fetches)
	full := f.rn.quota(time.Until(f.deadline)) * f.cfg.lanesPerPartition()
	f.mu.Lock()
	defer f.mu.Unlock()
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		tp := topicPartition{p.Topic, p.Partition}
		fp := f.parts[tp]
		if fp == nil {
			fp = &fedPartition{}
			f.parts[tp] = fp
		}
		fp.pending += len(p.Records)
		f.pending += len(p.Records)
		f.polled += len(p.Records)
		for _, r := range p.Records {
			k := laneKey{tp: tp}
			if f.cfg.order == KeyOrder && r.Key != nil {
				k.key = fnv32a(r.Key) % uint32(keyLanesPerSlot*f.cfg.concurrency)
			}
			l := f.lanes[k]
			if l == nil {
				l = &lane{}
				f.lanes[k] = l
			}
			l.queue = append(l.queue, r)
			if !l.running {
				l.running = true
				f.wg.Add(1)
				go f.run(tp, l)
			}
		}
		if !fp.paused && fp.pending >= full {
			fp.paused = true
			f.rn.pauser.PauseFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
		}
	})
}

// run handles l's records in order until its queue is empty. After a
// failure it drops them: the batch will not commit.
func (f *feed) run(tp topicPartition, l *lane) {
	defer f.wg.Done()
	for {
		f.mu.Lock()
		if len(l.queue) == 0 {
			l.running = false
			f.mu.Unlock()
			return
		}
		r := l.queue[0]
		l.queue[0] = nil
		l.queue = l.queue[1:]
		f.mu.Unlock()
		if !f.failed.Load() {
			f.slots <- struct{}{}
			began := time.Now()
			before := l.handled
			if before == 0 && f.rn.budget > 0 && began.Sub(f.b.start) > f.rn.budget/2 {
				// Fed late, with less than half the budget left: a
				// record that runs out of it was not slow alone.
				before = 1
			}
			ok := !f.failed.Load() && f.rn.handle(f.ctx, f.hctx, f.b, r, before)
			l.handled++
			f.rn.took(time.Since(began))
			<-f.slots
			if !ok && !f.failed.Swap(true) {
				f.stop()
			}
		}
		f.done(tp)
	}
}

// done notes that a record of tp is done: a paused partition whose lanes
// ran dry is resumed while there is time for another record.
func (f *feed) done(tp topicPartition) {
	f.mu.Lock()
	fp := f.parts[tp]
	fp.pending--
	f.pending--
	if fp.paused && fp.pending == 0 && !f.failed.Load() && f.rn.perRecord.Load() < int64(time.Until(f.deadline)) {
		fp.paused = false
		f.resume(map[string][]int32{tp.topic: {tp.partition}})
	}
	f.mu.Unlock()
	select {
	case f.progress <- struct{}{}:
	default:
	}
}

// room is how many records the next poll may take (at most limit more),
// or 0 when the poller should wait for the lanes first: until one
// record's time is known, one record per lane, and then no more than the
// lanes can handle before the deadline, all partitions together and per
// partition.
func (f *feed) room(limit int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rn.perRecord.Load() == 0 && f.pending > 0 {
		return 0 // learn a record's time first
	}
	q := f.rn.quota(time.Until(f.deadline))
	perPartition := q * f.cfg.lanesPerPartition()
	k := min(perPartition, q*f.cfg.concurrency-f.pending, limit-f.polled)
	if k < max(1, perPartition/2) && f.pending > 0 {
		return 0
	}
	return max(k, 0)
}

// extend moves the deadline, once passed, to when the lanes are expected
// to be done with what they hold (the busiest lane's records, or all of
// them over the bound's lanes, whichever takes longer), if that is at
// least two records later: the transaction lasts that long anyway, and
// the lanes that run dry meanwhile may take more records. It reports
// whether it did; never past last (see extendedInterval), so that a
// transaction under a backlog still ends within twice its interval.
func (f *feed) extend() bool {
	per := time.Duration(f.rn.perRecord.Load())
	if per <= 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	busiest := 0
	for _, l := range f.lanes {
		busiest = max(busiest, len(l.queue))
	}
	end := time.Now().Add(per * time.Duration(max(busiest, f.pending/f.cfg.concurrency)))
	if end.After(f.last) {
		end = f.last
	}
	if end.Sub(f.deadline) < 2*per {
		return false
	}
	f.deadline = end
	return true
}

// wait waits for a lane's progress, the deadline or ctx's end.
func (f *feed) wait(ctx context.Context) {
	t := time.NewTimer(time.Until(f.deadline))
	defer t.Stop()
	select {
	case <-f.progress:
	case <-t.C:
	case <-ctx.Done():
	}
}

// finish waits for the lanes and resumes the partitions the feed paused,
// and returns how many those were.
func (f *feed) finish() int {
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	paused, n := map[string][]int32{}, 0
	for tp, fp := range f.parts {
		if fp.paused {
			fp.paused = false
			paused[tp.topic] = append(paused[tp.topic], tp.partition)
			n++
		}
	}
	if n > 0 {
		f.resume(paused)
	}
	return n
}

// resume fetches ps again, but the partitions a restore of the keyed
// state holds paused (restores.go): they come once restored.
func (f *feed) resume(ps map[string][]int32) {
	if ks := f.rn.p.state; ks != nil {
		ks.resumeUnlessRestoring(f.rn.pauser, ps)
		return
	}
	f.rn.pauser.ResumeFetchPartitions(ps)
}

// collectFed is collect under Concurrency above 1: lanes fed across polls
// (see feed). It polls until the batch is full, its interval is over, a
// rebalance took partitions, a partition was assigned (a stateful
// processor's), Run's ctx ended or a record failed; then it waits for the
// lanes, and reports whether every polled record was handled.
func (rn *runner) collectFed(ctx, hctx context.Context, b *batch, first kgo.Fetches, poll func(context.Context, int) kgo.Fetches, revoked *atomic.Bool, limit int, assigned func() bool) bool {
	cfg := rn.p.cfg
	feedCtx, stop := context.WithCancel(rn.stop)
	defer stop()
	f := &feed{rn: rn, ctx: ctx, hctx: hctx, b: b, cfg: cfg,
		deadline: b.start.Add(cfg.commitInterval), last: b.start.Add(rn.extendedInterval()), slots: make(chan struct{}, cfg.concurrency), stop: stop,
		progress: make(chan struct{}, 1), lanes: map[laneKey]*lane{}, parts: map[topicPartition]*fedPartition{}}
	fetches := first
	for {
		f.dispatch(fetches)
		if f.failed.Load() || ctx.Err() != nil {
			break
		}
		if f.polled >= limit || !time.Now().Before(f.deadline) && !f.extend() || revoked.Load() || rn.stop.Err() != nil || assigned() {
			break // stopping: commit what was handled, every polled record included
		}
		k := f.room(limit)
		if k == 0 {
			f.wait(feedCtx)
			fetches = nil
			continue
		}
		pollCtx, cancel := context.WithDeadline(feedCtx, f.deadline)
		fetches = poll(pollCtx, k)
		cancel()
		rn.p.obs.Fetched(fetches)
		if ctx.Err() != nil {
			break
		}
		loop.LogFetchErrors(fetches, rn.p.logger)
		if rn.p.state != nil {
			// A store is restored while no lane handles records, as
			// between transactions.
			if err := rn.p.state.prepare(ctx, fetches, false, f.wg.Wait); err != nil {
				rn.p.state.fail(err)
				f.failed.Store(true)
				break
			}
		}
	}
	if paused := f.finish(); paused > 0 && revoked.Load() {
		rn.p.logger.Debug("eos: a rebalance took partitions while lanes held paused ones; resumed them", "paused", paused)
	}
	return !f.failed.Load() && ctx.Err() == nil
}

// extendedInterval is how long after its start a batch's deadline may be
// moved (extend): two commit intervals, and within two thirds of the
// transaction's budget, so that lanes fed until then still end well
// within it (a commit interval may be up to half the transaction timeout,
// which is two thirds of the budget).
func (rn *runner) extendedInterval() time.Duration {
	d := 2 * rn.p.cfg.commitInterval
	if rn.budget > 0 {
		d = min(d, rn.budget*2/3)
	}
	return d
}

// took notes the time a lane took for one record: an average over recent
// records (an exponentially weighted one, 1/8 for the newest), from which
// quota works out how many records a lane can handle in a given time.
func (rn *runner) took(d time.Duration) {
	d = max(d, time.Nanosecond)
	old := rn.perRecord.Load()
	if old == 0 {
		rn.perRecord.Store(int64(d))
		return
	}
	rn.perRecord.Store(old + (int64(d)-old)/8)
}

// quota is how many records a lane can handle in d (at least 1, at most
// pollPerLane); 1 until a record's time is known.
func (rn *runner) quota(d time.Duration) int {
	per := rn.perRecord.Load()
	if per <= 0 {
		return 1
	}
	return int(min(max(int64(d)/per, 1), pollPerLane))
}

// pollSize is how many records a batch's first poll may take, of at most
// limit: under Concurrency above 1, what the lanes can handle in a commit
// interval (see feed).
func (rn *runner) pollSize(limit int) int {
	cfg := rn.p.cfg
	if cfg.concurrency <= 1 || rn.isolate {
		return min(limit, cfg.maxPoll())
	}
	return min(limit, rn.quota(cfg.commitInterval)*cfg.lanesPerPartition())
}

// fnv32a is FNV-1a over b, without hash/fnv's allocation per record.
func fnv32a(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	return h
}
