package eos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf16"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// A hanging transaction (KIP-664) is one that a partition still holds open
// while its transaction coordinator has moved on: the coordinator finished
// or forgot it, so no marker will ever close it on that partition. Apache
// Kafka 4.4 leaves such transactions in __consumer_offsets after a broker
// bounce (found by the chaos suite: the coordinator reported the
// transactional id Empty or CompleteAbort at a later epoch, while the
// group's offsets partition kept the transaction's offset commit pending).
// A pending transactional offset commit makes the group's offset fetch
// answer UNSTABLE_OFFSET_COMMIT until a marker arrives, so every partition
// of the group with a pending commit stops being consumed: forever, since
// no transaction timeout applies to a transaction the coordinator no
// longer tracks. The cure is Kafka's own (kafka-transactions.sh abort):
// write the abort marker to that partition with WriteTxnMarkers.

const offsetsTopic = "__consumer_offsets"

// maxTransactionTimeout is the broker's default transaction.max.timeout.ms:
// no transaction can live longer, so an open one whose coordinator state
// this client cannot see is hanging once it is older than this.
const maxTransactionTimeout = 15 * time.Minute

// hangSweeper finds and aborts hanging transactions in the partition of
// __consumer_offsets that holds one group's offsets, and in the partitions
// the processor wrote to: there a hanging transaction holds the last
// stable offset back, and read_committed readers of the output see
// nothing past it.
type hangSweeper struct {
	adm       *kadm.Client
	group     string
	outputs   *partitionSet
	logger    *slog.Logger
	partition int32 // of __consumer_offsets; -1 until known
	disabled  bool  // the broker refused us the requests
}

func newHangSweeper(adm *kadm.Client, group string, outputs *partitionSet, logger *slog.Logger) *hangSweeper {
	return &hangSweeper{adm: adm, group: group, outputs: outputs, logger: logger, partition: -1}
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

// run sweeps every interval until ctx ends.
func (s *hangSweeper) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for !s.disabled {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.sweep(ctx); err != nil && ctx.Err() == nil {
			if isAuthError(err) {
				s.disabled = true
				s.logger.Warn("eos: not allowed to look for hanging transactions; the check is off (see HangingTransactionCheck)", "err", err)
				continue
			}
			s.logger.Debug("eos: hanging-transaction check failed", "err", err)
		}
	}
}

// sweep aborts the transactions that hang in the group's offsets partition
// or in a partition the processor wrote to, and returns how many it
// aborted. A transaction is hanging only when all of these hold: a
// partition holds it open; the coordinator of its transactional id is not
// in it (neither Ongoing at that producer epoch nor preparing to end it),
// or, if the coordinator's state cannot be seen, it is older than any
// transaction may live; and the partition still holds it open, unchanged,
// after the coordinator was asked, so that a marker in flight is never
// overtaken.
func (s *hangSweeper) sweep(ctx context.Context) (int, error) {
	if s.partition < 0 {
		p, err := s.offsetsPartition(ctx)
		if err != nil {
			return 0, err
		}
		s.partition = p
	}
	set := s.outputs.snapshot()
	set.Add(offsetsTopic, s.partition)
	before, err := s.openTransactions(ctx, set)
	if err != nil || len(before) == 0 {
		return 0, err
	}

	var ids []int64
	seenID := map[int64]bool{}
	for k := range before {
		if !seenID[k.producerID] {
			seenID[k.producerID] = true
			ids = append(ids, k.producerID)
		}
	}
	listed, err := s.adm.ListTransactions(ctx, ids, nil)
	if err != nil {
		return 0, fmt.Errorf("list transactions: %w", err)
	}
	txnIDs := map[int64]string{}
	var names []string
	listed.Each(func(t kadm.ListedTransaction) {
		txnIDs[t.ProducerID] = t.TxnID
		names = append(names, t.TxnID)
	})
	described := kadm.DescribedTransactions{}
	if len(names) > 0 {
		if described, err = s.adm.DescribeTransactions(ctx, names...); err != nil {
			return 0, fmt.Errorf("describe transactions: %w", err)
		}
	}
	candidates := map[openTxn]kadm.DescribedProducer{}
	for k, p := range before {
		name, seen := txnIDs[k.producerID]
		if !seen {
			// Unknown to every coordinator this client may ask: hanging
			// only once no transaction timeout could explain it.
			if time.Since(time.UnixMilli(p.LastTimestamp)) > maxTransactionTimeout {
				candidates[k] = p
			}
			continue
		}
		d, ok := described[name]
		if !ok || d.Err != nil || d.ProducerID != k.producerID {
			continue
		}
		switch d.State {
		case "PrepareCommit", "PrepareAbort", "PrepareEpochFence":
			continue // its markers are on their way
		case "Ongoing":
			if d.ProducerEpoch == p.ProducerEpoch {
				continue // the live transaction
			}
		}
		candidates[k] = p
	}
	if len(candidates) == 0 {
		return 0, nil
	}

	after, err := s.openTransactions(ctx, set)
	if err != nil {
		return 0, err
	}
	var markers []kadm.TxnMarkers
	for k, p := range candidates {
		if q, ok := after[k]; ok && q.ProducerEpoch == p.ProducerEpoch && q.CurrentTxnStartOffset == p.CurrentTxnStartOffset {
			markers = append(markers, kadm.TxnMarkers{
				ProducerID: k.producerID, ProducerEpoch: p.ProducerEpoch, CoordinatorEpoch: p.CoordinatorEpoch,
				Topics: kadm.TopicsSet{k.topic: {k.partition: {}}},
			})
		}
	}
	if len(markers) == 0 {
		return 0, nil
	}
	aborted := 0
	// One request per marker: a marker names one producer, and a failure
	// on one partition must not hide the others.
	for _, m := range markers {
		k := openTxn{m.ProducerID, firstTopic(m.Topics), firstPartition(m.Topics)}
		p := candidates[k]
		resp, err := s.adm.WriteTxnMarkers(ctx, m)
		if err == nil {
			resp.EachPartition(func(r kadm.TxnMarkersPartitionResponse) { err = errors.Join(err, r.Err) })
		}
		if err != nil {
			if isAuthError(err) {
				return aborted, err
			}
			s.logger.Warn("eos: aborting a hanging transaction failed", "producer_id", k.producerID, "partition", fmt.Sprintf("%s[%d]", k.topic, k.partition), "err", err)
			continue
		}
		aborted++
		s.logger.Warn("eos: aborted a hanging transaction",
			"producer_id", k.producerID, "producer_epoch", p.ProducerEpoch, "transactional_id", txnIDs[k.producerID],
			"partition", fmt.Sprintf("%s[%d]", k.topic, k.partition), "open_since_offset", p.CurrentTxnStartOffset)
	}
	return aborted, nil
}

// openTxn names a transaction a partition holds open.
type openTxn struct {
	producerID int64
	topic      string
	partition  int32
}

func firstTopic(s kadm.TopicsSet) string {
	for t := range s {
		return t
	}
	return ""
}

func firstPartition(s kadm.TopicsSet) int32 {
	for _, ps := range s {
		for p := range ps {
			return p
		}
	}
	return -1
}

// openTransactions returns the transactions open in set's partitions.
func (s *hangSweeper) openTransactions(ctx context.Context, set kadm.TopicsSet) (map[openTxn]kadm.DescribedProducer, error) {
	described, err := s.adm.DescribeProducers(ctx, set)
	if err != nil {
		return nil, fmt.Errorf("describe producers: %w", err)
	}
	open := map[openTxn]kadm.DescribedProducer{}
	described.EachProducer(func(p kadm.DescribedProducer) {
		if p.CurrentTxnStartOffset >= 0 {
			open[openTxn{p.ProducerID, p.Topic, p.Partition}] = p
		}
	})
	return open, nil
}

// offsetsPartition returns the partition of __consumer_offsets that holds
// the group's offsets, as the broker picks it: the group id's Java
// String.hashCode, made non-negative, modulo the partition count.
func (s *hangSweeper) offsetsPartition(ctx context.Context) (int32, error) {
	topics, err := s.adm.ListTopics(ctx, offsetsTopic)
	if err != nil {
		return 0, fmt.Errorf("metadata of %s: %w", offsetsTopic, err)
	}
	d, ok := topics[offsetsTopic]
	if !ok || d.Err != nil || len(d.Partitions) == 0 {
		return 0, fmt.Errorf("metadata of %s: %v", offsetsTopic, d.Err)
	}
	return groupPartition(s.group, int32(len(d.Partitions))), nil
}

func groupPartition(group string, partitions int32) int32 {
	return (javaStringHash(group) & 0x7fffffff) % partitions
}

// javaStringHash is Java's String.hashCode: over UTF-16 code units, with
// int32 overflow.
func javaStringHash(s string) int32 {
	var h int32
	for _, u := range utf16.Encode([]rune(s)) {
		h = 31*h + int32(u)
	}
	return h
}

func isAuthError(err error) bool {
	var ae *kadm.AuthError
	return errors.As(err, &ae) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed) ||
		errors.Is(err, kerr.TopicAuthorizationFailed) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}
