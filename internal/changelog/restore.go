// Package changelog restores a partition's [state.Store] from its
// changelog topic and checks (or creates) the changelog: the Kafka side of
// package state, which a runner drives when a partition is assigned.
//
// A restore reads with read_committed up to the partition's high watermark
// as it lists it first, waiting for the transactions open there to end:
// the previous owner's last transaction may be committed in the group's
// offsets (which is when this owner gets the partition) before its marker
// reached the changelog, so that the last stable offset still lies before
// its records; stopping there would lose them. A transaction of a dead
// owner holds the restore until the broker aborts it at its timeout. It fetches with raw
// Fetch requests to the partition's leader and decodes them with
// kgo.ProcessFetchPartition, which returns the offset to fetch next:
// past aborted batches and transaction markers too, which a kgo consumer
// drops without saying how far it got. That offset is what a store's
// checkpoint must hold; a consumer's last record offset is not enough
// when the changelog ends with an aborted transaction.
package changelog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/state"
)

// Defaults of [Options].
const (
	DefaultTimeout       = 5 * time.Minute
	DefaultFetchMaxBytes = 8 << 20
	fetchMaxWait         = 500 * time.Millisecond
	retryBackoff         = 200 * time.Millisecond
)

// Options tune a restore.
type Options struct {
	// Timeout bounds how long a restore of one partition may go without
	// progress (default DefaultTimeout): no apply moving the store's
	// checkpoint for that long (a leader out of reach, a store that
	// fails, a transaction left open on the changelog) stops it with a
	// *state.RestoreError saying how far it got. A restore that keeps
	// applying is never cut, however long it takes, as Kafka Streams has
	// no cap on a restore either.
	Timeout time.Duration
	// FetchMaxBytes is the most one fetch returns (default
	// DefaultFetchMaxBytes); each fetch's records are one Apply.
	FetchMaxBytes int32
	// Logger gets one line per restore at Info, and one at Warn when a
	// store is wiped (default: slog.Default()). Never a key or value.
	Logger *slog.Logger
	// Stable reads up to the last stable offset listed when the restore
	// starts, not the high watermark: what is committed now, without
	// waiting for a transaction open on the partition to end (a
	// standby's catch-up, which the next one takes further). A restore
	// that takes a partition over must not: the previous owner's last
	// transaction may commit after its offsets did.
	Stable bool
}

// Result says what a restore did.
type Result struct {
	// From is the offset read from, To the high watermark it read up to
	// (at least); Records how many records it applied.
	From, To int64
	Records  int
	// Wiped says why the store's content was dropped before reading
	// ("" when it was not): the topic was created again, the checkpoint
	// lies past the changelog's end, or before its start.
	Wiped string
	Took  time.Duration
}

// Restorer restores stores from changelog partitions through one client.
type Restorer struct {
	cl  *kgo.Client
	adm *kadm.Client
}

// NewRestorer makes a Restorer on a client of its own built from conn
// (seed brokers, TLS, SASL: the connection's options only). It needs
// Describe and Read on the changelog topics.
func NewRestorer(conn []kgo.Opt) (*Restorer, error) {
	cl, err := kgo.NewClient(conn...)
	if err != nil {
		return nil, fmt.Errorf("changelog: new client: %w", err)
	}
	return &Restorer{cl: cl, adm: kadm.NewClient(cl)}, nil
}

// Close closes the Restorer's client.
func (r *Restorer) Close() { r.cl.Close() }

// Restore brings s up to the committed end of partition of topic: from
// s's checkpoint (after wiping s if its checkpoint does not belong to the
// topic as it is now: another topic ID, past the high watermark, or
// before the log start offset) to the high watermark listed when it
// starts, once every transaction open below it ended, applying each fetch's committed records (a nil value deletes
// its key) in one Apply with the checkpoint the fetch reached. Records
// of aborted transactions are never applied.
//
// It returns a *state.RestoreError naming the partition and how far it
// got when it makes no progress for o.Timeout or ctx ends (a leader out
// of reach, a store that fails), or at once on a refused ACL (an
// *eoskit.AuthorizationError inside) or a topic that does not exist.
// What it applied stays applied: a later restore goes on from there.
func (r *Restorer) Restore(ctx context.Context, topic string, partition int32, s state.Store, o Options) (Result, error) {
	o = o.withDefaults()
	start := time.Now()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopWatch := watchProgress(s, o.Timeout, cancel)
	defer stopWatch()
	rs := &restore{r: r, topic: topic, partition: partition, s: s, o: o, target: -1}
	rs.res.From = s.Checkpoint().Offset
	err := rs.run(ctx)
	rs.res.Took = time.Since(start)
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
			if rs.last != nil {
				err = fmt.Errorf("%w (last error: %w)", err, rs.last)
			}
		}
		return rs.res, &state.RestoreError{Topic: topic, Partition: partition, From: rs.res.From,
			Reached: s.Checkpoint().Offset, Target: rs.target, Err: err}
	}
	o.Logger.Info("changelog restored", "topic", topic, "partition", partition, "from", rs.res.From,
		"to", rs.res.To, "records", rs.res.Records, "wiped", rs.res.Wiped, "took", rs.res.Took.Round(time.Millisecond))
	return rs.res, nil
}

// errNoProgress is the cause a stalled restore ends with; it wraps
// context.DeadlineExceeded, as the deadline it is.
type errNoProgress struct{ d time.Duration }

func (e errNoProgress) Error() string {
	return fmt.Sprintf("no progress for %s (RestoreTimeout)", e.d)
}
func (e errNoProgress) Unwrap() error { return context.DeadlineExceeded }

// watchProgress cancels the restore with errNoProgress once s's
// checkpoint has not moved for d; the returned func stops the watch and
// waits for it, so that s is not read after the restore returned.
func watchProgress(s state.Store, d time.Duration, cancel context.CancelCauseFunc) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		tick := time.NewTicker(max(min(d/4, time.Second), time.Millisecond))
		defer tick.Stop()
		last, since := s.Checkpoint(), time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				if cp := s.Checkpoint(); cp != last {
					last, since = cp, now
				} else if now.Sub(since) >= d {
					cancel(errNoProgress{d})
					return
				}
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.FetchMaxBytes <= 0 {
		o.FetchMaxBytes = DefaultFetchMaxBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// restore is one partition's restore under way.
type restore struct {
	r         *Restorer
	topic     string
	partition int32
	s         state.Store
	o         Options

	id             state.TopicID
	leader         int32
	startOff, high int64
	target         int64 // the high watermark read up to; -1: unknown yet
	res            Result
	last           error     // the last retriable error, for the deadline's error
	refusedSince   time.Time // when a refusal for want of an ACL was first met
	// next is the offset the next fetch reads from: past the store's
	// checkpoint while a fetch's records are being applied (applying,
	// one at a time), so that the next fetch overlaps that apply.
	next     int64
	applying chan error
	applied  int // the records of the apply under way
}

// errGiveUp marks an error retrying cannot cure.
type errGiveUp struct{ err error }

func (e errGiveUp) Error() string { return e.err.Error() }
func (e errGiveUp) Unwrap() error { return e.err }

func (rs *restore) run(ctx context.Context) error {
	if err := rs.retry(ctx, rs.locate); err != nil {
		return err
	}
	if err := rs.align(); err != nil {
		return err
	}
	rs.res.From = rs.s.Checkpoint().Offset
	rs.res.To = rs.target
	rs.next = rs.res.From
	// Until the store holds the target: the last apply's failure too is
	// retried (settle moves next back to the store's checkpoint).
	step := func(ctx context.Context) error {
		if rs.next >= rs.target {
			return rs.settle()
		}
		return rs.fetch(ctx)
	}
	for rs.next < rs.target || rs.applying != nil {
		if err := rs.retry(ctx, step); err != nil {
			return errors.Join(err, rs.settle())
		}
	}
	return nil
}

// settle waits for the apply under way, if any. A failed apply leaves the
// store at its checkpoint, where the next fetch reads from again.
func (rs *restore) settle() error {
	if rs.applying == nil {
		return nil
	}
	err := <-rs.applying
	rs.applying = nil
	if err != nil {
		rs.next = rs.s.Checkpoint().Offset
		rs.last = err
		if errors.Is(err, state.ErrClosed) {
			return errGiveUp{err} // no retry opens it again
		}
		return err
	}
	rs.res.Records += rs.applied
	return nil
}

// retry calls step until it succeeds, fails for good, or ctx ends.
func (rs *restore) retry(ctx context.Context, step func(context.Context) error) error {
	for {
		err := step(ctx)
		if err == nil {
			return nil
		}
		if ge, ok := errors.AsType[errGiveUp](err); ok {
			return ge.err
		}
		if ctx.Err() != nil {
			return err
		}
		rs.last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retryBackoff):
		}
	}
}

// locate learns the topic's ID, the partition's leader and its offsets:
// log start and high watermark (the target).
func (rs *restore) locate(ctx context.Context) error {
	tds, err := rs.r.adm.ListTopics(ctx, rs.topic)
	if err != nil {
		return rs.refused(err)
	}
	td, ok := tds[rs.topic]
	switch {
	case !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition):
		return fmt.Errorf("changelog topic %q not found", rs.topic)
	case td.Err != nil:
		return rs.refused(td.Err)
	}
	pd, ok := td.Partitions[rs.partition]
	switch {
	case !ok:
		return fmt.Errorf("changelog topic %q has no partition %d (it has %d)", rs.topic, rs.partition, len(td.Partitions))
	case pd.Err != nil:
		return fmt.Errorf("partition metadata: %w", pd.Err)
	case pd.Leader < 0:
		return errors.New("partition has no leader")
	}
	rs.id, rs.leader = state.TopicID(td.ID), pd.Leader
	lists := []func(context.Context, ...string) (kadm.ListedOffsets, error){rs.r.adm.ListStartOffsets, rs.r.adm.ListEndOffsets}
	if rs.o.Stable {
		lists = append(lists, rs.r.adm.ListCommittedOffsets) // the last stable offset
	}
	offs := make([]int64, len(lists))
	for i, list := range lists {
		lo, err := list(ctx, rs.topic)
		l, ok := lo.Lookup(rs.topic, rs.partition)
		switch {
		case ok && l.Err != nil:
			return rs.refused(l.Err)
		case !ok && err != nil:
			return rs.refused(err)
		case !ok:
			return errors.New("no offsets listed for the partition")
		}
		offs[i] = l.Offset
	}
	rs.startOff, rs.high, rs.target = offs[0], offs[1], offs[1]
	if rs.o.Stable {
		rs.target = min(offs[2], rs.high)
	}
	return nil
}

// refused turns a refusal for want of an ACL into an
// *eoskit.AuthorizationError, which gives up once refusals lasted
// authz.DefaultGrace (an ACL granted a moment after the start is fine).
func (rs *restore) refused(err error) error {
	if ae, ok := errors.AsType[*kadm.AuthError](err); ok {
		err = ae.Err
	}
	if !authz.Refused(err) {
		return err
	}
	ae := &eoskit.AuthorizationError{Permission: "Read on topic " + rs.topic, Err: err}
	if rs.refusedSince.IsZero() {
		rs.refusedSince = time.Now()
	}
	if time.Since(rs.refusedSince) < authz.DefaultGrace {
		return ae
	}
	return errGiveUp{ae}
}

// align wipes the store when its checkpoint does not belong to the
// topic's log as it is now, and starts it at the log start offset.
func (rs *restore) align() error {
	cp := rs.s.Checkpoint()
	var why string
	switch {
	case cp.TopicID != rs.id && cp.TopicID != (state.TopicID{}):
		why = "the changelog topic was created again (another topic ID)"
	case cp.Offset > rs.high:
		why = fmt.Sprintf("the checkpoint %d lies past the changelog's high watermark %d", cp.Offset, rs.high)
	case cp.Offset < rs.startOff:
		why = fmt.Sprintf("the checkpoint %d lies before the changelog's log start offset %d", cp.Offset, rs.startOff)
	case cp.TopicID == (state.TopicID{}) && cp.Offset > 0:
		why = "the checkpoint names no topic"
	case cp.TopicID == (state.TopicID{}):
		// An empty store: give it the topic's ID.
		return rs.reset(rs.startOff)
	default:
		return nil
	}
	if cp.Offset > 0 || cp.TopicID != (state.TopicID{}) {
		rs.res.Wiped = why
		rs.o.Logger.Warn("changelog restore wipes the store and reads the whole changelog", "topic", rs.topic,
			"partition", rs.partition, "reason", why)
	}
	return rs.reset(rs.startOff)
}

func (rs *restore) reset(at int64) error {
	if err := rs.s.Reset(state.Checkpoint{TopicID: rs.id, Offset: at}); err != nil {
		return fmt.Errorf("reset the store: %w", err)
	}
	return nil
}

// fetch reads once from next, and applies what it got once the previous
// fetch's apply ended: in the background, so that the next fetch (the
// broker's read, the transfer, the decoding) overlaps it.
func (rs *restore) fetch(ctx context.Context) error {
	from := rs.next
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(fetchMaxWait / time.Millisecond)
	req.MinBytes = 1
	req.MaxBytes = rs.o.FetchMaxBytes
	req.IsolationLevel = 1 // read_committed
	req.SessionEpoch = -1  // no fetch session
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = rs.topic, rs.id
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition = rs.partition
	rp.FetchOffset = from
	rp.CurrentLeaderEpoch = -1
	rp.LogStartOffset = -1
	rp.PartitionMaxBytes = rs.o.FetchMaxBytes
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)

	resp, err := req.RequestWith(ctx, rs.r.cl.Broker(int(rs.leader)))
	if err != nil {
		return rs.relocate(ctx, fmt.Errorf("fetch from broker %d: %w", rs.leader, err))
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return rs.relocate(ctx, fmt.Errorf("fetch: %w", err))
	}
	var got *kmsg.FetchResponseTopicPartition
	for i := range resp.Topics {
		for j := range resp.Topics[i].Partitions {
			if p := &resp.Topics[i].Partitions[j]; p.Partition == rs.partition {
				got = p
			}
		}
	}
	if got == nil {
		return rs.relocate(ctx, errors.New("fetch response lacks the partition"))
	}
	switch perr := kerr.ErrorForCode(got.ErrorCode); {
	case errors.Is(perr, kerr.OffsetOutOfRange):
		// The log start moved past the checkpoint (DeleteRecords, a
		// delete policy's retention on a changelog Check could not
		// verify) or the log was truncated:
		// align again against the offsets as they are now, once the
		// store holds what was fetched.
		if err := rs.settle(); err != nil {
			return err
		}
		if err := rs.locate(ctx); err != nil {
			return err
		}
		if err := rs.align(); err != nil {
			return err
		}
		rs.next = rs.s.Checkpoint().Offset
		return nil
	case perr != nil:
		return rs.relocate(ctx, fmt.Errorf("fetch: %w", rs.refused(perr)))
	}
	fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
		Offset: from, IsolationLevel: kgo.ReadCommitted(), Topic: rs.topic, Partition: rs.partition,
	}, got, kgo.DefaultDecompressor(), nil)
	if fp.Err != nil && len(fp.Records) == 0 {
		return fmt.Errorf("decode fetch at offset %d: %w", from, fp.Err)
	}
	writes := make([]state.Write, 0, len(fp.Records))
	for _, rec := range fp.Records {
		if rec.Key == nil {
			continue // a compacted topic refuses null keys; nothing to apply
		}
		writes = append(writes, state.Write{Key: rec.Key, Value: rec.Value})
	}
	if next <= from {
		// Nothing yet (the leader had nothing past from within its
		// wait): the apply under way may have ended meanwhile.
		return rs.settle()
	}
	if err := rs.settle(); err != nil {
		return err
	}
	cp, done := state.Checkpoint{TopicID: rs.id, Offset: next}, make(chan error, 1)
	go func() {
		if err := rs.s.Apply(writes, cp); err != nil {
			done <- fmt.Errorf("apply %d records up to offset %d: %w", len(writes), next, err)
			return
		}
		done <- nil
	}()
	rs.applying, rs.applied, rs.next = done, len(writes), next
	return nil
}

// relocate returns err after learning the partition's leader again, for
// the retry that follows.
func (rs *restore) relocate(ctx context.Context, err error) error {
	if ge, ok := errors.AsType[errGiveUp](err); ok {
		return ge
	}
	target := rs.target
	if lerr := rs.locate(ctx); lerr != nil {
		if ge, ok := errors.AsType[errGiveUp](lerr); ok {
			return ge
		}
	}
	// Keep reading towards the target listed first: the restore's end
	// does not move with the writers'.
	if target >= 0 {
		rs.target = target
	}
	return err
}
