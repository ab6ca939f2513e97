package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/authz"
)

// kafkaWaitError ends Run: the relay waited for Kafka to take a batch for
// RetryFor, which bounds that wait as it bounds the retries.
type kafkaWaitError struct{ err error }

func (e *kafkaWaitError) Error() string { return e.err.Error() }

func (e *kafkaWaitError) Unwrap() error { return e.err }

// watchKafkaWait shows a wait for Kafka that began at began while it
// lasts: past kafkaWaitNoticed it is the relay's LastError (Health is not
// Healthy until a batch commits) and a Warn line, repeated every
// kafkaWaitRepeat. The returned func ends the watch.
func (r *Relay) watchKafkaWait(began time.Time) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		timer := time.NewTimer(kafkaWaitNoticed)
		defer timer.Stop()
		for {
			select {
			case <-done:
				return
			case <-timer.C:
			}
			waited := time.Since(began).Round(time.Second)
			r.obs.Failed(fmt.Errorf("outbox: waiting for Kafka to take a batch since %s (%s)", began.Format(time.RFC3339), waited))
			r.cfg.logger.Warn("outbox: waiting for Kafka to take a batch", "slot", r.cfg.slot, "waited", waited, "gives_up_after", r.cfg.retryFor)
			timer.Reset(kafkaWaitRepeat)
		}
	}()
	return func() { close(done); wg.Wait() }
}

// kafkaWaitNoticed is how long a wait for Kafka lasts before the relay's
// health and log show it; kafkaWaitRepeat how often the log says it
// again.
const (
	kafkaWaitNoticed = 5 * time.Second
	kafkaWaitRepeat  = 30 * time.Second
)

// publishAll publishes the session's batches, each in a Kafka
// transaction that carries the slot's position, until an error (or ctx's
// end). It reports whether it published anything.
func (r *Relay) publishAll(ctx context.Context, rs *relaySession) (progressed bool, err error) {
	s, p := rs.s, rs.p
	published := rs.from
	b := &pending{dead: r.dead}
	for {
		if len(b.txns) == 0 {
			t, err := s.next(ctx, time.Time{}, published)
			if err != nil {
				return progressed, err
			}
			r.obs.Read()
			b.txns = append(b.txns, t)
		}
		cur, next := b, func(until time.Time) (*dbTxn, error) {
			t, err := s.next(ctx, until, published)
			if t != nil && r.cfg.hooks.readTxn != nil {
				r.cfg.hooks.readTxn(len(t.rows))
			}
			return t, asDatabaseError(err)
		}
		if b.isolate {
			// Finding whose fault a refusal was: the first database
			// transaction alone, its records probed first (see probe),
			// then published with what was refused dead-lettered; or,
			// should that fail again, one record at a time.
			cur = &pending{txns: b.txns[:1], dead: b.dead, oneByOne: b.oneByOne}
			next = func(time.Time) (*dbTxn, error) { return nil, nil }
			if !b.oneByOne {
				err := r.probe(ctx, s, p, b.txns[0])
				switch {
				case errors.Is(err, errNoProbe):
					b.oneByOne, cur.oneByOne = true, true
				case errors.Is(err, eos.ErrFenced) && !r.takenOver(ctx, s):
					return progressed, r.lonelyFence(err)
				case err != nil:
					return progressed, err
				}
			}
		}
		// The batch is read whole before its Kafka transaction begins:
		// reading a large database transaction takes its time, which
		// must not count against the transaction's timeout. A failed
		// read is no transaction's abort.
		if err := r.cfg.collect(cur, next); err != nil {
			return progressed, err
		}
		began := time.Now()
		err := r.publishBatch(ctx, s, p, cur)
		timedOut := errors.Is(err, eos.ErrFenced) && !r.takenOver(ctx, s)
		r.observe(ctx, cur, began, err, timedOut)
		if err == nil {
			published = cur.txns[len(cur.txns)-1].end
			progressed = true
			if r.cfg.hooks.afterCommit != nil && r.cfg.hooks.afterCommit() {
				return progressed, errors.New("outbox: a test ended the session after a commit, before the slot was told")
			}
			for _, t := range cur.txns {
				for _, rw := range t.rows {
					delete(r.dead, rw.id)
				}
				if t.end >= r.iso.end {
					r.iso = isolation{}
				}
			}
			if b.isolate && len(b.txns) > 1 {
				// The rest as usual: a refusal among them isolates
				// again.
				b = &pending{txns: b.txns[1:], dead: r.dead}
			} else {
				b = &pending{dead: r.dead}
			}
			if err := s.published(ctx, published); err != nil {
				return progressed, err
			}
			continue
		}
		if timedOut {
			return progressed, r.lonelyFence(err)
		}
		if final(err) {
			return progressed, err
		}
		if gone := r.cfg.topicGone(ctx, err); gone != nil {
			return progressed, gone
		}
		if retry, err := r.blame(ctx, err, b); !retry {
			return progressed, err
		}
	}
}

// publishBatch publishes b, read whole, in one Kafka transaction with the
// position (or, at least once, acknowledged), its rows deleted meanwhile,
// the stream kept alive while Kafka takes it, for RetryFor at most.
func (r *Relay) publishBatch(ctx context.Context, s *stream, p publisher, b *pending) error {
	doneWaiting := s.waiting(0)
	defer doneWaiting()
	// RetryFor bounds the wait for Kafka too: franz-go retries a produce
	// for as long as it is let.
	pubCtx, cancelPub := context.WithTimeout(ctx, r.cfg.retryFor)
	defer cancelPub()
	stopWatch := r.watchKafkaWait(time.Now())
	err := p.publish(pubCtx, b, func(ctx context.Context, b *pending) ([]carriedTxn, error) {
		carry, err := r.deleteRows(ctx, b)
		return carry, asDatabaseError(err)
	})
	stopWatch()
	if err != nil && pubCtx.Err() != nil && ctx.Err() == nil {
		err = &kafkaWaitError{fmt.Errorf("outbox: Kafka did not take a batch within RetryFor (%s), giving up: %w", r.cfg.retryFor, err)}
	}
	return err
}

// maxLonelyFences bounds how often, within lonelyFenceWindow, a relay
// fenced with no other relay on its slot restarts before it stops as
// fenced.
const (
	maxLonelyFences   = 5
	lonelyFenceWindow = 10 * time.Minute
)

// lonelyFence is what a fence with no other relay holding the slot
// becomes. No relay of this slot can fence this one without taking the
// slot first: the coordinator ended a transaction that outlived its
// timeout (which bumps the epoch), or a producer that is no relay of this
// slot used the transactional id. The first is cured by a new session
// with a new producer (should another relay have taken the slot
// meanwhile, this one stands by), so the error it returns restarts the
// session. The second would not be: two relays of different slots (or
// databases) sharing a transactional id fence each other for ever, each
// restart aborting the other's transaction. Past maxLonelyFences within
// lonelyFenceWindow, it returns err itself, final, naming the likely
// cause.
func (r *Relay) lonelyFence(err error) error {
	now := time.Now()
	r.lonelyFences = append(slices.DeleteFunc(r.lonelyFences, func(t time.Time) bool { return now.Sub(t) > lonelyFenceWindow }), now)
	if len(r.lonelyFences) > maxLonelyFences {
		r.lonelyFences = nil
		return fmt.Errorf("outbox: fenced %d times within %s with no other relay holding slot %s: another producer uses transactional id %q (it must be unique to this slot's relays): %w",
			maxLonelyFences+1, lonelyFenceWindow, r.cfg.slot, r.cfg.txnID, err)
	}
	return fmt.Errorf("outbox: the producer was fenced with no other relay holding the slot (by the coordinator, at a transaction's timeout, or a producer that is no relay): %s", err)
}

// databaseError marks a failure of PostgreSQL (reading the log, deleting
// the rows) within a publish, for the metrics' abort reason.
type databaseError struct{ error }

func (e databaseError) Unwrap() error { return e.error }

// asDatabaseError marks err, if any, as PostgreSQL's.
func asDatabaseError(err error) error {
	if err == nil {
		return nil
	}
	return databaseError{err}
}

// observe reports a publish of b that began at began and ended with err.
// timedOut: the producer was fenced while the relay still holds its slot,
// so the coordinator ended a transaction that outlived its timeout.
func (r *Relay) observe(ctx context.Context, b *pending, began time.Time, err error, timedOut bool) {
	elapsed := time.Since(began)
	_, dbErr := errors.AsType[databaseError](err)
	switch {
	case err == nil:
		rows, dead := 0, 0
		for _, t := range b.txns {
			rows += len(t.rows)
			for _, rw := range t.rows {
				if _, ok := b.dead[rw.id]; ok {
					dead++
				}
			}
		}
		// Dead letters are not outputs, as in eos.
		r.obs.Committed(rows, rows-dead, elapsed)
		r.obs.DeadLettered(dead)
	case ctx.Err() != nil:
		r.obs.Aborted("shutdown", elapsed)
	case timedOut:
		r.obs.Aborted("timeout", elapsed)
	case dbErr:
		r.obs.Aborted("database-error", elapsed)
	case authz.Refused(err):
		r.obs.Aborted("refused", elapsed)
	case errors.Is(err, eos.ErrFenced):
		r.obs.Fenced()
		r.obs.Aborted("fenced", elapsed)
	case errors.Is(err, eos.ErrOutcomeUnknown):
		r.obs.Aborted("outcome-unknown", elapsed)
	default:
		r.obs.Aborted("produce-error", elapsed)
	}
}

// blame decides, after a failed publish, whether one record is at fault
// and may be dead-lettered (retry the same batch) or the error ends the
// session.
func (r *Relay) blame(ctx context.Context, err error, b *pending) (retry bool, _ error) {
	dead := b.dead
	pe, ok := errors.AsType[*eos.ProduceError](err)
	if !ok || pe.Record == nil {
		return false, err
	}
	info, ok := pe.Record.Context.Value(rowKey{}).(rowInfo)
	if !ok || info.id < 0 { // the position record
		return false, err
	}
	cause := pe.Err
	if info.partition >= 0 && strings.Contains(cause.Error(), "invalid record partitioning choice") {
		cause = r.cfg.partitionMissing(ctx, info.topic, info.partition, cause)
	}
	if _, already := dead[info.id]; already {
		err := fmt.Errorf("outbox: the dead letter of record %d could not be written to %s: %w", info.id, r.cfg.deadLetter, cause)
		if recordsFault(cause) {
			return false, finalError{err}
		}
		return false, err // a refused ACL, say: retried for RetryFor (a missing topic is topicGone's)
	}
	if recordsFault(cause) && !b.oneByOne && !errors.Is(cause, ErrInvalidPartition) {
		// Kafka refuses a produce batch whole (one larger than the
		// topic's max.message.bytes, say): every record in it fails
		// alike, and the first is not to blame. Isolate the batch's
		// first database transaction, probing its records; should it
		// be refused again after that, publish it one acknowledged
		// record at a time.
		if !b.isolate {
			r.cfg.logger.Warn("outbox: records refused; probing the batch's records to find whose fault it is", "err", cause)
			b.isolate = true
		} else {
			r.cfg.logger.Warn("outbox: records refused after probing; publishing the database transaction one record at a time", "err", cause)
			b.oneByOne = true
		}
		return true, nil
	}
	rerr := &RecordError{ID: info.id, Topic: info.topic, Partition: info.partition, Err: cause}
	if !recordsFault(cause) {
		// A missing topic or a refused ACL: not the record's fault, and
		// perhaps soon fixed; retried until RetryFor.
		return false, rerr
	}
	if r.cfg.deadLetter == "" {
		return false, finalError{rerr}
	}
	r.cfg.logger.Warn("outbox: record refused; dead-lettering it", "id", info.id, "topic", info.topic, "dead_letter_topic", r.cfg.deadLetter, "err", cause)
	dead[info.id] = cause
	return true, nil
}
