package consume

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/internal/loop"
)

// dispatch starts a batch for each partition of a poll's records (under
// Concurrency above 1), after the partition's batches under way, and
// pauses a partition whose lane is full, so that it holds laneDepth
// batches at most while the others keep flowing. kgo drops what a fetch
// buffered past a paused partition's last batch, and fetches it again on
// resume, from where that batch ends.
func (s *session) dispatch(recs []*kgo.Record) {
	pause := map[string][]int32{}
	var started []*batch
	s.mu.Lock()
	for _, part := range loop.ByPartition(recs) {
		at := tp{part[0].Topic, part[0].Partition}
		l := s.lanes[at]
		if l == nil {
			l = &lane{}
			s.lanes[at] = l
		}
		b := &batch{recs: part, tp: at, lane: l, prev: l.last, done: make(chan struct{}), taken: make(chan struct{})}
		l.last = b
		l.pending++
		if l.pending >= laneDepth && !l.paused {
			l.paused = true
			pause[at.topic] = append(pause[at.topic], at.partition)
		}
		started = append(started, b)
	}
	s.mu.Unlock()
	if len(pause) > 0 {
		s.cl.PauseFetchPartitions(pause)
	}
	s.batches.Add(len(started))
	for _, b := range started {
		go s.commitBatch(b)
	}
}

// commitBatch commits b after the batch before it in its lane, once a
// Concurrency slot is free; it is dropped if that batch failed (its
// records are fetched again once Runner.Failed moved the partition back)
// or the group took the partition meanwhile.
func (s *session) commitBatch(b *batch) {
	defer s.batches.Done()
	if b.prev != nil {
		<-b.prev.done
	}
	switch {
	case b.prev != nil && b.prev.err != nil && !errors.Is(b.prev.err, errDropped):
		// Its records follow ones that did not commit. (One dropped
		// before it was fetched after the partition was moved back:
		// with laneDepth 2, a lane is paused until its failed batch
		// is settled.)
		b.err = errDropped
	default:
		select {
		case s.slots <- struct{}{}:
			if !s.mayStart(b) {
				b.err = errDropped // taken, Run is draining, or a batch failed for good: not started
			} else {
				b.err = s.core.run.Commit(s.work, s.cl, b.recs)
			}
			if b.err != nil && !errors.Is(b.err, errDropped) {
				s.failing(b) // before its slot is free
			}
			<-s.slots
		case <-b.taken:
			b.err = errDropped
		case <-s.ctx.Done():
			b.err = errDropped
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b.prev = nil
	s.ended = append(s.ended, b)
	close(b.done)
	if s.wake != nil {
		s.wake() // the loop settles it now, not at the next records
	}
}

// failing notes that b ended with an error the poll loop has yet to
// settle: no batch starts until it is (mayStart).
func (s *session) failing(b *batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b.unsettled = true
	if s.unsettled == 0 {
		s.settledAll = make(chan struct{})
	}
	s.unsettled++
}

// settledFailures notes that the poll loop settled ended: a failure among
// them no longer holds the batches waiting to start.
func (s *session) settledFailures(ended []*batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range ended {
		if b.unsettled {
			b.unsettled = false
			if s.unsettled--; s.unsettled == 0 {
				close(s.settledAll)
			}
		}
	}
}

// mayStart reports whether b, holding a Concurrency slot, may start: its
// partition was not taken, Run is not draining, and no batch failed for
// good. A failure not settled yet may be for good: b waits for the poll
// loop to settle it, or to end.
func (s *session) mayStart(b *batch) bool {
	for {
		s.mu.Lock()
		n, settled, failed := s.unsettled, s.settledAll, s.failed
		s.mu.Unlock()
		if b.revoked.Load() || s.ctx.Err() != nil || failed != nil {
			return false
		}
		if n == 0 {
			return true
		}
		select {
		case <-settled:
		case <-b.taken:
			return false
		case <-s.ctx.Done():
			return false
		case <-s.finishing: // its settle comes after the batches ended
			return false
		}
	}
}

// seek is the core's AdjustFetchOffsetsFn: the runner's Seek, whose
// stored positions go to Kafka too under Runner.CommitToKafka.
func (s *session) seek(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	offsets, stored, err := s.core.run.Seek(ctx, offsets)
	if err != nil || s.commits == nil {
		return offsets, err
	}
	var at []*kgo.Record
	for t, parts := range stored {
		for p, next := range parts {
			if next > 0 {
				// As the last record before next: its commit is next.
				at = append(at, &kgo.Record{Topic: t, Partition: p, Offset: next - 1, LeaderEpoch: -1})
			}
		}
	}
	s.commits.Add(at...)
	// The poll under way waits for records, of which there may be none
	// more: cut it short, or the next one, so that the loop commits.
	s.mu.Lock()
	if s.wake != nil {
		s.wake()
	} else {
		s.sought = true
	}
	s.mu.Unlock()
	return offsets, nil
}

// assigned is the core's OnPartitionsAssigned.
func (s *session) assigned(_ context.Context, cl *kgo.Client, parts map[string][]int32) {
	if s.commits != nil {
		s.commits.Assigned(cl) // after every rebalance: the member its partitions are now with
	}
	s.core.Obs.Assigned(parts)
}

// revoked is the core's OnPartitionsRevoked: the partitions' batches end
// (those not started are dropped) and their offsets go to Kafka before
// the group hands the partitions over.
func (s *session) revoked(_ context.Context, cl *kgo.Client, parts map[string][]int32) {
	s.takeBack(cl, parts, true)
	s.core.Obs.Revoked(parts)
}

// lost is the core's OnPartitionsLost: as revoked, but the session that
// could commit them to Kafka is gone.
func (s *session) lost(_ context.Context, cl *kgo.Client, parts map[string][]int32) {
	s.takeBack(cl, parts, false)
	s.core.Obs.Lost(parts)
}

// takeBack waits for the batches of parts to end and settles them here
// (the poll loop is held by the rebalance), then forgets the partitions
// and clears their pause, which kgo would otherwise keep for a later
// assignment. A batch that outlasts the wait (await) is left to end on
// its own: it is settled as nothing (none of it goes to Kafka, its error
// ends nothing), and logged if it committed. When the partitions were
// lost (commit false), nothing goes to Kafka either: the session that
// could commit them is gone.
func (s *session) takeBack(cl *kgo.Client, parts map[string][]int32, commit bool) {
	taken := func(at tp) bool { return slices.Contains(parts[at.topic], at.partition) }
	s.mu.Lock()
	var last []*batch
	for at, l := range s.lanes {
		if taken(at) {
			l.last.revoke() // and the batch before it, if it has not started
			if l.last.prev != nil {
				l.last.prev.revoke()
			}
			last = append(last, l.last)
		}
	}
	s.mu.Unlock()
	s.await(cl, last)
	s.mu.Lock()
	var ended []*batch
	s.ended = slices.DeleteFunc(s.ended, func(b *batch) bool {
		if b.lane != nil && taken(b.tp) {
			ended = append(ended, b)
			return true
		}
		return false
	})
	for at := range s.lanes {
		if taken(at) {
			delete(s.lanes, at) // a batch still under way is another member's
		}
	}
	s.mu.Unlock()
	// What the batches committed first (a batch stopped on a record may
	// have committed the records before it): on a revoke their offsets
	// go to Kafka before the group hands the partitions over.
	failures := make([]error, len(ended))
	defer s.settledFailures(ended)
	for i, b := range ended {
		failures[i] = s.committed(b)
		if !commit {
			s.committedStale(b, "in the database, but the partition was lost (the group session ended: a stall past the session timeout, or a coordinator error)")
		}
	}
	if commit && s.commits != nil {
		_ = s.commits.Commit(s.work, cl, s.core.run.CommitWhat)
	}
	if s.commits != nil {
		s.commits.Forget(parts) // the new owner commits them
	}
	if s.core.run.Taken != nil {
		s.core.run.Taken(parts)
	}
	// The failed ones once the runner forgot the partitions, so that
	// Failed moves nothing of theirs back (a refused batch is the next
	// owner's to read); one that failed for good still ends Run.
	for i, b := range ended {
		if err := s.failure(cl, b, failures[i]); err != nil {
			s.mu.Lock()
			if s.failed == nil {
				s.failed = err
			}
			s.mu.Unlock()
		}
	}
	cl.ResumeFetchPartitions(parts)
}

// await waits for batches to end, but no longer than the group's
// rebalance timeout: a revoke that waits for ever would hold its
// partition from the group for good (kgo keeps heartbeating meanwhile),
// where a stalled poll loop gets the member dropped after that timeout.
// The next owner of a partition whose batch is still under way is kept
// from applying a record twice by the runner's commit step (offsetstore's
// compare-and-set on the stored offset, dedup's claim of the ids).
func (s *session) await(cl *kgo.Client, batches []*batch) {
	limit, _ := cl.OptValue(kgo.RebalanceTimeout).(time.Duration)
	timer := time.NewTimer(max(limit, time.Second))
	defer timer.Stop()
	for _, b := range batches {
		select {
		case <-b.done:
		case <-timer.C:
			s.core.cfg.Logger.Warn(s.core.pkg+": a batch of a partition the group took is still under way after the rebalance timeout; handing the partition over without it",
				"topic", b.tp.topic, "partition", b.tp.partition, "first_offset", b.recs[0].Offset, "records", len(b.recs))
			return
		}
	}
}
