// Package hanging is the hanging-transaction check of eos's exactly-once
// processor (eos.HangingTransactionCheck, eos.OnHangingTransaction): a
// session builds one with New and asks only what Check declares; what a
// hanging transaction is, and how the check decides its outcome, is below.
package hanging

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/preset"
	"github.com/eoskit/eoskit/internal/txnscan"
)

// A hanging transaction (KIP-664) is one that a partition still holds open
// while its transaction coordinator has moved on, so that no marker will
// ever close it. The chaos suite found Apache Kafka 4.4 leaving them behind
// after broker bounces, even for transactions whose EndTxn had answered
// success: the coordinator reported the transactional id at a later epoch,
// while __consumer_offsets (DescribeProducers) still held the committed
// transaction's offset commit pending, so the group's offset fetch answered
// UNSTABLE_OFFSET_COMMIT for good; once an output partition held one too,
// its last stable offset stuck, and read_committed readers saw nothing past
// it.
//
// By default a processor only looks (DescribeProducers,
// DescribeTransactions), reports what it finds with the evidence of its
// outcome, and stops or waits (Policy) before a transaction of its
// own could join it. Under RepairHangingTransactions it closes it: the
// cure is to write the missing marker (WriteTxnMarkers, as
// kafka-transactions.sh does), and it must carry the outcome the
// transaction's records already have, or exactly-once breaks: aborting an
// offset commit whose outputs are visible duplicates them, committing one
// whose outputs were aborted loses them. The chaos suite saw both risks
// realised by earlier versions of this check (750 duplicates from always
// aborting; 750 and 1,500 lost from trusting EndTxn's answer). The second
// came from a further broker failure: a committed transaction lost its
// marker in an output partition, the processor's next transaction wrote to
// that partition and joined it (a partition holds one open transaction per
// producer), and that transaction's abort marker closed both.
//
// So a processor closes only its own transactions, and decides how each
// ended from the best evidence there is: the log of the output partitions
// it wrote to (the first marker of its producer after the transaction's
// first record there is what decided those records), then its own EndTxn
// answer, then its coordinator's state right after that transaction
// (transaction protocol v2 gives each transaction its own epoch). It writes
// the same marker to every partition still holding the transaction, waits
// while a later live transaction has joined it somewhere, and leaves alone,
// reporting at Error level, one whose outcome it cannot know.

// Check is all a session asks of the hanging-transaction check
// (eos.HangingTransactionCheck). New builds one per session: a
// hangSweeper, or off when the check is off.
type Check interface {
	// BeforeClaim sweeps before the session registers its transactional
	// id (see hangSweeper.beforeClaim).
	BeforeClaim(ctx context.Context)
	// AfterDisconnect sweeps as BeforeClaim does when a broker connection
	// closed since it last looked: the markers of a transaction that
	// already ended may be missing, and the next transaction's offset
	// commit would join it in __consumer_offsets and share its marker.
	// It runs before the first transaction after a disconnect.
	AfterDisconnect(ctx context.Context)
	// Hold applies the policy (eos.OnHangingTransaction) before a
	// transaction: while the last sweep found a hanging transaction of
	// this processor, StopWhenHanging returns it (once a sweep a second
	// later confirms it) and WaitWhenHanging waits, sweeping every check
	// interval; either returns it when a sweep is refused and the check
	// turns off. It returns nil to go on: when nothing hangs (always
	// under RepairHangingTransactions, whose sweeps close what they can)
	// or when ctx ends.
	Hold(ctx context.Context) error
	// Poll wraps a session's poll so that it returns early when a sweep
	// finds a hanging transaction.
	Poll(loop.PollFunc) loop.PollFunc
	// Start sweeps every check interval, in the background, until stop;
	// stop returns once the sweeps have ended.
	Start(ctx context.Context) (stop func())
	// Ended notes how a transaction of this processor ended and where it
	// wrote: the evidence a sweep decides a hanging one's outcome by.
	Ended(producerID int64, epoch int16, rec Record)
}

// Config is what a session's check is built from.
type Config struct {
	Interval     time.Duration // between sweeps; 0 turns the check off
	Policy       Policy
	Group, TxnID string
	// Conn makes the clients that read a partition's log directly.
	Conn   []kgo.Opt
	Logger *slog.Logger
	// Found counts a hanging transaction found, by outcome
	// ("committed", "aborted", "unknown"): under detect, each the first
	// time it is reported; under repair, each closed, or reported
	// unknown.
	Found func(outcome string)
	// History is the processor's, kept across sessions; Committed
	// reports whether the processor has committed a transaction.
	History   *History
	Committed func() bool
}

// Policy is what the check does about a hanging transaction of the
// processor's own: eos.HangingPolicy's choice.
type Policy int8

const (
	// Stop: Hold returns the *Finding (eos.StopWhenHanging).
	Stop Policy = iota
	// Wait: Hold waits until it is gone (eos.WaitWhenHanging).
	Wait
	// Repair: sweeps write the marker of its outcome
	// (eos.RepairHangingTransactions).
	Repair
)

// ClaimPatience is how long a new session retries registering its
// transactional id, and BeforeClaim its sweep, before it gives up and
// restarts: longer than a broker restart, so that a bounce costs no more
// than the bounce itself.
const ClaimPatience = time.Minute

// Finding is a hanging transaction of the processor's own: what
// eos.HangingTransactionError reports (eos converts it; the fields are
// the same).
type Finding struct {
	Topic         string
	Partition     int32
	ProducerID    int64
	ProducerEpoch int16
	StartOffset   int64
	Outcome       string
	Evidence      string
}

func (e *Finding) Error() string {
	return fmt.Sprintf("eos: a transaction of this processor hangs in %s[%d] (producer id %d, epoch %d, open since offset %d; outcome %s, from %s)",
		e.Topic, e.Partition, e.ProducerID, e.ProducerEpoch, e.StartOffset, e.Outcome, e.Evidence)
}

// endTimeout bounds a read of the cluster's state.
const endTimeout = 30 * time.Second

// New returns the check of a session whose client is cl, and
// whose client hooks include disconnected. It reads the cluster's
// transaction.version; under RepairHangingTransactions it refuses a
// cluster on which writing markers cannot be done safely (checkRepairable),
// and asks for a restart when the version cannot be read.
func New(ctx context.Context, cfg Config, cl *kgo.Client, disconnected *DisconnectFlag) (Check, error) {
	if cfg.Interval <= 0 {
		return off{}, nil
	}
	vctx, cancel := context.WithTimeout(ctx, endTimeout)
	level, err := txnscan.TransactionVersion(vctx, cl)
	cancel()
	if cfg.Policy == Repair {
		if err != nil {
			return nil, loop.Restart(err)
		}
		if err := checkRepairable(ctx, cl, level); err != nil {
			return nil, err
		}
	} else if err != nil {
		cfg.Logger.Debug("eos: reading the cluster's transaction.version failed; outcomes of hanging transactions will be unknown", "err", err)
	}
	return &hangSweeper{adm: kadm.NewClient(cl), readerOpts: cfg.Conn, group: cfg.Group, txnID: cfg.TxnID,
		outputs: &cfg.History.written, outcomes: &cfg.History.outcomes, committed: cfg.Committed, logger: cfg.Logger,
		disconnected: disconnected, interval: cfg.Interval, partition: -1, reported: map[hangKey]bool{},
		waiting: map[hangKey]*waited{}, announced: map[hangKey]bool{}, policy: cfg.Policy, v2: level >= 2 && speaksV2(cl), metrics: cfg.Found,
		foundNew: make(chan struct{}, 1)}, nil
}

// off is the check turned off (HangingTransactionCheck(0)):
// it never sweeps, holds or remembers anything.
type off struct{}

func (off) BeforeClaim(context.Context)     {}
func (off) AfterDisconnect(context.Context) {}
func (off) Hold(context.Context) error      { return nil }
func (off) Poll(poll loop.PollFunc) loop.PollFunc {
	return poll
}
func (off) Start(context.Context) func() { return func() {} }
func (off) Ended(int64, int16, Record)   {}

// hangSweeper finds and closes this processor's hanging transactions in the
// partition of __consumer_offsets that holds its group's offsets and in the
// partitions it wrote to.
type hangSweeper struct {
	adm          *kadm.Client
	readerOpts   []kgo.Opt // to read a partition's log directly
	group        string
	txnID        string
	outputs      *partitionSet
	outcomes     *txnOutcomes
	committed    func() bool // whether the processor has committed a transaction
	logger       *slog.Logger
	disconnected *DisconnectFlag // a broker connection closed since afterDisconnect looked
	interval     time.Duration   // between periodic sweeps
	disabled     atomic.Bool     // the broker refused us the requests

	// mu serialises sweeps: the periodic one runs beside the one the
	// processor runs before a transaction after a disconnect.
	mu        sync.Mutex
	partition int32               // of __consumer_offsets; -1 until known, offsetsRefused
	reported  map[hangKey]bool    // repair mode: unknown outcomes reported
	waiting   map[hangKey]*waited // repair mode: hangs whose evidence is awaited
	announced map[hangKey]bool    // detect mode: hangs reported (and counted)
	// noOffsetsTopic: the last sweep found no __consumer_offsets topic.
	noOffsetsTopic, warnedNoOffsetsTopic bool
	// policy is what to do with a hanging transaction; found, unless
	// repairing, the first hanging transaction the last sweep found (an
	// atomic, so that the check before every transaction never waits for
	// a sweep in progress).
	policy  Policy
	v2      bool // the cluster runs transaction protocol v2
	found   atomic.Pointer[Finding]
	metrics func(outcome string)
	// foundNew tells a waiting poll that a sweep found hanging
	// transactions.
	foundNew chan struct{}
}

// offsetsRefused marks a group's offsets partition that the principal may
// not describe (no Read on __consumer_offsets).
const offsetsRefused = -2

// refuseOffsets makes the check look at the outputs alone from now on: it
// may not read the group's offsets partition (Read on __consumer_offsets,
// which shows every group's offsets, is not granted).
func (s *hangSweeper) refuseOffsets(err error) {
	s.partition = offsetsRefused
	s.logger.Warn("eos: the hanging-transaction check cannot look at the group's offsets; it covers the partitions this processor writes to (grant this principal Read on topic "+txnscan.OffsetsTopic+" to cover them too)", "err", err)
}

// offsetsUnreadable reports whether DescribeProducers on the group's
// offsets partition alone is refused.
func (s *hangSweeper) offsetsUnreadable(ctx context.Context) bool {
	_, err := txnscan.Open(ctx, s.adm, kadm.TopicsSet{txnscan.OffsetsTopic: {s.partition: {}}})
	return err != nil && txnscan.IsAuthError(err)
}

// hanging returns the first hanging transaction the last sweep found, or
// nil.
func (s *hangSweeper) hanging() *Finding { return s.found.Load() }

// hold applies the policy to what the last sweep found: see Check.
func (s *hangSweeper) Hold(ctx context.Context) error {
	confirmed := false
	for {
		h := s.hanging()
		if h == nil {
			return nil
		}
		wait := s.interval
		if s.policy == Stop {
			// One look is not enough to stop for good: a sweep that
			// raced a transaction's end can see it open at one
			// epoch and the coordinator past it. Look again.
			if confirmed {
				return h
			}
			confirmed, wait = true, time.Second
		}
		if !loop.Sleep(ctx, wait) {
			return nil
		}
		if !s.sweepOnce(ctx) {
			// Not a confirmation: what the last sweep found stands,
			// and is looked at again.
			confirmed = false
			if s.disabled.Load() {
				return h // refused from now on: stopping or waiting is all that is left
			}
		}
	}
}

// afterDisconnect sweeps as beforeClaim does if a broker connection closed
// since it last looked.
func (s *hangSweeper) AfterDisconnect(ctx context.Context) {
	if s.disconnected.Swap(false) {
		s.BeforeClaim(ctx)
	}
}

// ended notes where a transaction wrote, for the sweeps to look there, and
// how it ended.
func (s *hangSweeper) Ended(producerID int64, epoch int16, rec Record) {
	for tp := range rec.Firsts {
		s.outputs.add(tp.Topic, tp.Partition)
	}
	s.outcomes.record(producerID, epoch, rec)
}

// History is what the check remembers across a processor's sessions:
// the partitions it wrote to, where the check looks besides the group's
// offsets, and how its recent transactions ended.
type History struct {
	written  partitionSet
	outcomes txnOutcomes
}

// partitionSet is the set of partitions a processor wrote to, filled from
// produce promises.
type partitionSet struct {
	mu  sync.Mutex
	set kadm.TopicsSet
}

func (s *partitionSet) add(topic string, partition int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set == nil {
		s.set = kadm.TopicsSet{}
	}
	if _, ok := s.set[topic][partition]; !ok {
		s.set.Add(topic, partition)
	}
}

func (s *partitionSet) snapshot() kadm.TopicsSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := kadm.TopicsSet{}
	for t, ps := range s.set {
		for p := range ps {
			c.Add(t, p)
		}
	}
	return c
}

// txnOutcomes remembers, for this processor's recent transactions (by
// producer id and epoch), how EndTxn answered and where each wrote first.
type txnOutcomes struct {
	mu    sync.Mutex
	ended map[producerEpoch]Record
	order []producerEpoch
	// ids are the producer ids the processor ended transactions under,
	// the latest keptIDs: they outlast the outcomes kept (a producer id
	// lasts 32,767 transactions under protocol v2).
	ids []int64
}

// keptIDs is how many of its producer ids a processor remembers.
const keptIDs = 8

type producerEpoch struct {
	id    int64
	epoch int16
}

// TopicPartition names an output partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Record is what the processor knows of one of its transactions.
type Record struct {
	Committed bool // what EndTxn answered, when Known
	Known     bool
	// Firsts is the first offset the transaction wrote in each output
	// partition: where its fate can be read back from the log.
	Firsts map[TopicPartition]int64
}

// keptOutcomes bounds the memory: a hanging transaction is found within a
// sweep interval or two, long before this many transactions have passed.
const keptOutcomes = 256

func (o *txnOutcomes) record(id int64, epoch int16, rec Record) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ended == nil {
		o.ended = map[producerEpoch]Record{}
	}
	if !slices.Contains(o.ids, id) {
		o.ids = append(o.ids, id)
		if len(o.ids) > keptIDs {
			o.ids = o.ids[1:]
		}
	}
	k := producerEpoch{id, epoch}
	if _, ok := o.ended[k]; !ok {
		o.order = append(o.order, k)
	}
	o.ended[k] = rec
	if len(o.order) > keptOutcomes {
		delete(o.ended, o.order[0])
		o.order = o.order[1:]
	}
}

// used reports whether the processor ended a transaction under producer
// id (one of the last keptIDs it used): its own, though the coordinator
// has moved it to another (under protocol v2 a producer id's epochs run
// out after 32,767 transactions, and the coordinator gives it a new one).
// A process remembers only its own: a restart forgets them.
func (o *txnOutcomes) used(id int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Contains(o.ids, id)
}

func (o *txnOutcomes) lookup(id int64, epoch int16) (Record, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rec, ok := o.ended[producerEpoch{id, epoch}]
	return rec, ok
}

// DisconnectFlag is a franz-go hook that notes that a connection to a
// broker closed: the next transaction first looks for hanging ones.
type DisconnectFlag struct{ atomic.Bool }

func (f *DisconnectFlag) OnBrokerDisconnect(kgo.BrokerMetadata, net.Conn) { f.Store(true) }

// errMarkersInFlight says the coordinator is ending a transaction: look
// again once its markers are written.
var errMarkersInFlight = errors.New("the coordinator is writing markers")

// beforeClaim sweeps before the processor registers its transactional id,
// and before its first transaction after a broker disconnect: registering bumps the epoch, and with it goes the
// coordinator's record of how the previous transaction ended, which is
// what a predecessor's hanging transaction can be closed by; and the next
// transaction's data would join a hanging one in its partitions, to share
// whatever marker closes them. It retries, for up to ClaimPatience, while
// the broker cannot answer (a session restarts when the broker went away)
// or the coordinator is still writing markers.
func (s *hangSweeper) BeforeClaim(ctx context.Context) {
	deadline := time.Now().Add(ClaimPatience)
	for !s.disabled.Load() {
		_, err := s.sweep(ctx)
		switch {
		case err == nil || ctx.Err() != nil:
			return
		case s.turnOffIfUnanswerable(err):
			return
		case time.Now().After(deadline):
			s.logger.Warn("eos: could not look for hanging transactions before going on", "err", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// start runs run in a goroutine until stop, which waits for it to return.
func (s *hangSweeper) Start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		s.run(ctx)
	}()
	return func() { cancel(); <-swept }
}

// run sweeps every interval until ctx ends.
func (s *hangSweeper) run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for !s.disabled.Load() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sweepOnce(ctx)
		s.warnIfNoOffsetsTopic()
	}
}

// warnIfNoOffsetsTopic says once, after a periodic sweep, that the cluster
// still shows no offsets topic though the processor has committed offsets
// (Apache Kafka creates the topic when a group first finds its
// coordinator, and keeps the offsets there): the check cannot cover the
// group's offsets on such a cluster.
func (s *hangSweeper) warnIfNoOffsetsTopic() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.partition < 0 && s.noOffsetsTopic && !s.warnedNoOffsetsTopic && s.committed() {
		s.warnedNoOffsetsTopic = true
		s.logger.Warn("eos: the cluster lists no " + txnscan.OffsetsTopic + " topic (an in-process or non-Apache broker?); the hanging-transaction check covers only the partitions this processor writes to")
	}
}

// turnOffIfUnanswerable turns the check off, saying why once at Warn, when
// err shows that the cluster will never answer it: the requests are
// refused (the ACLs are missing) or not supported. It reports whether it
// did.
func (s *hangSweeper) turnOffIfUnanswerable(err error) bool {
	var why string
	switch {
	case txnscan.IsAuthError(err):
		var grant []string
		for _, t := range slices.Sorted(maps.Keys(s.outputs.snapshot())) {
			grant = append(grant, "Read on topic "+t)
		}
		why = "not allowed to look for hanging transactions: grant this principal " + strings.Join(append(grant, "Describe on transactional id "+s.txnID), ", ") +
			" (DescribeProducers, DescribeTransactions; to repair, WriteTxnMarkers needs ClusterAction)"
	case txnscan.IsUnsupportedError(err):
		why = "the cluster does not support the requests the check needs (DescribeProducers, DescribeTransactions: Kafka 2.8+)"
	default:
		return false
	}
	if s.disabled.CompareAndSwap(false, true) {
		s.logger.Warn("eos: the hanging-transaction check is off: "+why, "err", err)
	}
	return true
}

// sweepOnce sweeps and logs what went wrong; a refusal turns the check
// off. It reports whether the sweep completed.
func (s *hangSweeper) sweepOnce(ctx context.Context) bool {
	_, err := s.sweep(ctx)
	if err != nil && ctx.Err() == nil && !errors.Is(err, errMarkersInFlight) && !s.turnOffIfUnanswerable(err) {
		s.logger.Debug("eos: hanging-transaction check failed", "err", err)
	}
	return err == nil
}

// sweep closes this processor's hanging transactions and returns how many
// it closed. A transaction is closed only when all of these hold: a
// partition holds it open under this processor's producer id; the
// coordinator is not in it (neither Ongoing at that epoch nor preparing to
// end a transaction, whose markers are on their way); its outcome is known;
// and the partition still holds it open, unchanged, after the coordinator
// was asked, so that a marker in flight is never overtaken.
func (s *hangSweeper) sweep(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.partition == -1 {
		// A cluster on which no group has found its coordinator yet has
		// no offsets topic, and so nothing hanging in it: sweep the
		// outputs, and look for the topic again next time.
		p, err := txnscan.OffsetsPartition(ctx, s.adm, s.group)
		s.noOffsetsTopic = errors.Is(err, txnscan.ErrNoOffsetsTopic)
		switch {
		case err == nil:
			s.partition = p
		case txnscan.IsAuthError(err):
			s.refuseOffsets(err)
		case !s.noOffsetsTopic:
			return 0, err
		}
	}
	set := s.outputs.snapshot()
	if s.partition >= 0 {
		set.Add(txnscan.OffsetsTopic, s.partition)
	}
	if len(set) == 0 {
		return 0, nil
	}
	before, err := txnscan.Open(ctx, s.adm, set)
	if err != nil && txnscan.IsAuthError(err) && s.partition >= 0 && s.offsetsUnreadable(ctx) {
		s.refuseOffsets(err)
		delete(set, txnscan.OffsetsTopic)
		if len(set) == 0 {
			return 0, nil
		}
		before, err = txnscan.Open(ctx, s.adm, set)
	}
	if err != nil {
		return 0, err
	}
	s.logger.Debug("eos: looked for hanging transactions", "topics", slices.Sorted(maps.Keys(set)), "open", len(before))
	if len(before) == 0 {
		s.found.Store(nil)
		return 0, nil
	}
	described, err := s.adm.DescribeTransactions(ctx, s.txnID)
	if err != nil {
		return 0, fmt.Errorf("describe transaction %s: %w", s.txnID, err)
	}
	coord, ok := described[s.txnID]
	switch {
	case ok && errors.Is(coord.Err, kerr.TransactionalIDNotFound):
		s.found.Store(nil)
		return 0, nil // never registered: none of the open transactions is ours
	case !ok || coord.Err != nil:
		return 0, fmt.Errorf("describe transaction %s: %w", s.txnID, coord.Err)
	}
	switch coord.State {
	case "PrepareCommit", "PrepareAbort", "PrepareEpochFence":
		return 0, errMarkersInFlight
	}

	type decided struct {
		p      kadm.DescribedProducer
		commit bool
	}
	type decision struct {
		commit, known, wait bool
		evidence            string
	}
	decisions := map[producerEpoch]decision{} // one per transaction, however many partitions hold it
	candidates := map[txnscan.Key]decided{}
	var found []*Finding
	for k, p := range before {
		ours := k.ProducerID == coord.ProducerID || s.outcomes.used(k.ProducerID) // the latter: before its id moved on
		if !ours || txnscan.Classify(coord, p) != txnscan.Hanging {
			continue // another producer's, or the live transaction
		}
		d, ok := decisions[producerEpoch{k.ProducerID, p.ProducerEpoch}]
		if !ok {
			d.commit, d.known, d.wait, d.evidence = s.decide(ctx, coord, k.ProducerID, p.ProducerEpoch, before)
			decisions[producerEpoch{k.ProducerID, p.ProducerEpoch}] = d
		}
		commit, known, wait := d.commit, d.known, d.wait
		if !s.v2 {
			// Under transaction protocol v1 a producer keeps its epoch
			// across transactions: neither the coordinator's state nor
			// what this processor remembers names one transaction.
			known, d.evidence = false, "none: the cluster runs transaction protocol v1, where an epoch spans many transactions"
		}
		if s.policy != Repair {
			// Detect only: no marker is written. The processor stops
			// or waits before its next transaction, whose records
			// would join this one in the partition.
			outcome := "unknown"
			if known {
				outcome = txnscan.OutcomeName(commit)
			}
			found = append(found, &Finding{Topic: k.Topic, Partition: k.Partition, ProducerID: k.ProducerID,
				ProducerEpoch: p.ProducerEpoch, StartOffset: p.CurrentTxnStartOffset, Outcome: outcome,
				Evidence: fmt.Sprintf("%s; coordinator %s at epoch %d", d.evidence, coord.State, coord.ProducerEpoch)})
			continue
		}
		hk := hangKey{k.ProducerID, p.ProducerEpoch, k.Topic, k.Partition, p.CurrentTxnStartOffset}
		if wait {
			s.awaited(hk, d.evidence)
			continue
		}
		if !known {
			if !s.reported[hk] {
				s.reported[hk] = true
				if s.metrics != nil {
					s.metrics("unknown")
				}
				s.logger.Error("eos: a transaction of this processor hangs and its outcome is unknown; close it (eoskit txn close -outcome commit|abort) once you know whether it committed",
					"partition", fmt.Sprintf("%s[%d]", k.Topic, k.Partition), "owner_producer_id", k.ProducerID,
					"owner_producer_epoch", p.ProducerEpoch, "open_since_offset", p.CurrentTxnStartOffset,
					"coordinator_state", coord.State, "coordinator_epoch", coord.ProducerEpoch)
			}
			continue
		}
		candidates[k] = decided{p, commit}
	}
	if s.policy != Repair {
		return 0, s.keepHanging(ctx, set, found)
	}
	if len(candidates) == 0 {
		return 0, nil
	}

	after, err := txnscan.Open(ctx, s.adm, set)
	if err != nil {
		return 0, err
	}
	closed := 0
	for k, c := range candidates {
		q, ok := after[k]
		if !ok || q.ProducerEpoch != c.p.ProducerEpoch || q.CurrentTxnStartOffset != c.p.CurrentTxnStartOffset {
			continue
		}
		// One request per marker, so that a failure on one partition
		// hides no other.
		resp, err := s.adm.WriteTxnMarkers(ctx, kadm.TxnMarkers{
			ProducerID: k.ProducerID, ProducerEpoch: c.p.ProducerEpoch, CoordinatorEpoch: c.p.CoordinatorEpoch,
			Commit: c.commit, Topics: kadm.TopicsSet{k.Topic: {k.Partition: {}}},
		})
		if err == nil {
			resp.EachPartition(func(r kadm.TxnMarkersPartitionResponse) { err = errors.Join(err, r.Err) })
		}
		if err != nil {
			if txnscan.IsAuthError(err) {
				return closed, err
			}
			s.logger.Warn("eos: closing a hanging transaction failed", "partition", fmt.Sprintf("%s[%d]", k.Topic, k.Partition), "err", err)
			continue
		}
		closed++
		if s.metrics != nil {
			s.metrics(txnscan.OutcomeName(c.commit))
		}
		s.logger.Warn("eos: closed a hanging transaction",
			"partition", fmt.Sprintf("%s[%d]", k.Topic, k.Partition), "committed", c.commit,
			"owner_producer_id", k.ProducerID, "owner_producer_epoch", c.p.ProducerEpoch,
			"open_since_offset", c.p.CurrentTxnStartOffset)
	}
	return closed, nil
}

// keepHanging keeps, of found, what the partitions still hold open
// unchanged now that the coordinator was asked (a transaction that ended
// between the two questions is not hanging), reports each the first time,
// and makes them what hanging returns.
func (s *hangSweeper) keepHanging(ctx context.Context, set kadm.TopicsSet, found []*Finding) error {
	if len(found) > 0 {
		after, err := txnscan.Open(ctx, s.adm, set)
		if err != nil {
			return err
		}
		found = slices.DeleteFunc(found, func(h *Finding) bool {
			q, ok := after[txnscan.Key{ProducerID: h.ProducerID, Topic: h.Topic, Partition: h.Partition}]
			return !ok || q.ProducerEpoch != h.ProducerEpoch || q.CurrentTxnStartOffset != h.StartOffset
		})
	}
	slices.SortFunc(found, func(a, b *Finding) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	seen := map[hangKey]bool{}
	for _, h := range found {
		k := hangKey{h.ProducerID, h.ProducerEpoch, h.Topic, h.Partition, h.StartOffset}
		seen[k] = true
		if s.announced[k] {
			continue
		}
		s.announced[k] = true
		if s.metrics != nil {
			s.metrics(h.Outcome)
		}
		s.logger.Error("eos: a transaction of this processor hangs: its partition holds it open and its coordinator has moved on. Not writing past it; close it with the marker of its outcome (eoskit txn close: github.com/eoskit/eoskit/cmd/eoskit), or opt in to eos.RepairHangingTransactions",
			"partition", fmt.Sprintf("%s[%d]", h.Topic, h.Partition), "owner_producer_id", h.ProducerID,
			"owner_producer_epoch", h.ProducerEpoch, "open_since_offset", h.StartOffset,
			"outcome", h.Outcome, "evidence", h.Evidence)
	}
	// A hang closed since is forgotten: another one later in the same
	// partition is news.
	maps.DeleteFunc(s.announced, func(k hangKey, _ bool) bool { return !seen[k] })
	s.found.Store(nil)
	if len(found) > 0 {
		s.found.Store(found[0])
	}
	if len(found) > 0 {
		select {
		case s.foundNew <- struct{}{}:
		default:
		}
	}
	return nil
}

// poll wraps a poll so that it returns early when a sweep finds a hanging
// transaction: a hang in the group's offsets partition can keep every poll
// empty, and the processor must get to apply its policy.
func (s *hangSweeper) Poll(poll loop.PollFunc) loop.PollFunc {
	return loop.Interruptible(poll, s.foundNew)
}

// waited is how long repair has waited for a hang's evidence.
type waited struct {
	since  time.Time
	warned bool
}

// waitWarnAfter is how long repair waits for a hang's evidence (a later
// transaction joined in a partition, a marker that cannot be read) before
// it says so.
const waitWarnAfter = 2 * time.Minute

// awaited notes that repair waits on k's evidence (why), and warns once
// it has waited waitWarnAfter: the offsets stay held meanwhile.
func (s *hangSweeper) awaited(k hangKey, why string) {
	w := s.waiting[k]
	if w == nil {
		w = &waited{since: time.Now()}
		s.waiting[k] = w
	}
	if !w.warned && time.Since(w.since) >= waitWarnAfter {
		w.warned = true
		s.logger.Warn("eos: a transaction of this processor hangs, and repairing it waits for evidence of its outcome",
			"partition", fmt.Sprintf("%s[%d]", k.topic, k.partition), "owner_producer_id", k.producerID,
			"owner_producer_epoch", k.epoch, "open_since_offset", k.startOffset,
			"waiting_for", why, "waited", time.Since(w.since).Round(time.Second))
	}
}

// hangKey names one hanging transaction in one partition.
type hangKey struct {
	producerID  int64
	epoch       int16
	topic       string
	partition   int32
	startOffset int64
}

// checkRepairable refuses RepairHangingTransactions where writing markers
// cannot be done safely: the outcome the sweeper writes rests on
// transaction protocol v2 (an epoch per transaction), and WriteTxnMarkers
// needs ClusterAction. A cluster that cannot be asked right now restarts
// the session.
func checkRepairable(ctx context.Context, cl *kgo.Client, level int16) error {
	ctx, cancel := context.WithTimeout(ctx, endTimeout)
	defer cancel()
	refuse := func(reason string) error {
		// The check runs only under ExactlyOnce.
		return &eoskit.ConfigError{Package: "eos", Setting: "OnHangingTransaction", Semantics: preset.ExactlyOnce.String(), Reason: "RepairHangingTransactions: " + reason}
	}
	if level < 2 {
		return refuse(fmt.Sprintf("the cluster runs transaction.version %d; the outcome written rests on transaction protocol v2 (transaction.version 2, an epoch per transaction)", level))
	}
	if !speaksV2(cl) {
		return refuse("kgo.MaxVersions in ClientOptions caps this client below transaction protocol v2 (Produce v12, EndTxn v5, TxnOffsetCommit v5); the outcome written rests on an epoch per transaction")
	}
	req := kmsg.NewPtrDescribeClusterRequest()
	req.IncludeClusterAuthorizedOperations = true
	described, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(described.ErrorCode)
	}
	switch {
	case txnscan.IsAuthError(err):
		return refuse("not allowed to describe the cluster, so ClusterAction cannot be checked: " + err.Error())
	case err != nil:
		return loop.Restart(fmt.Errorf("read the cluster's authorized operations: %w", err))
	case !slices.Contains(kadm.DecodeACLOperations(described.ClusterAuthorizedOperations), kadm.OpClusterAction):
		// A principal without Describe on the cluster is told of no
		// operation at all: it cannot be told apart from one without
		// ClusterAction, and both are refused.
		return refuse("the cluster does not show ClusterAction (which WriteTxnMarkers needs) among this principal's operations; it needs Describe on the cluster too, for the check")
	}
	return nil
}

// speaksV2 reports whether cl uses transaction protocol v2 where the
// cluster offers it, as franz-go decides (Client.supportsKIP890p2): a
// client whose versions the user capped (kgo.MaxVersions in ClientOptions)
// below Produce v12, EndTxn v5 or TxnOffsetCommit v5 keeps v1, where an
// epoch spans many transactions, and the hanging-transaction check must
// not read outcomes as if each had its own.
func speaksV2(cl *kgo.Client) bool {
	v, ok := cl.OptValue(kgo.MaxVersions).(*kversion.Versions)
	if !ok || v == nil {
		return true
	}
	for key, min := range map[kmsg.Key]int16{kmsg.Produce: 12, kmsg.EndTxn: 5, kmsg.TxnOffsetCommit: 5} {
		if max, listed := v.LookupMaxKeyVersion(key.Int16()); !listed || max < min {
			return false
		}
	}
	return true
}
