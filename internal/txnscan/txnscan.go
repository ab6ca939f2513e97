// Package txnscan reads the transaction state a Kafka cluster holds: the
// transactions its partitions hold open (DescribeProducers), what their
// coordinators say of them (ListTransactions, DescribeTransactions), and the
// markers in a partition's log. It never writes: everything here needs only
// Read on the topics (DescribeProducers, and reading a log) and Describe on
// the transactional ids.
//
// A hanging transaction (KIP-664) is one that a partition holds open while
// its coordinator has moved on, so that no marker will ever close it: the
// partition's last stable offset stays below it, read_committed readers see
// nothing past it, and in __consumer_offsets the group's offsets stay
// pending. eos's processor looks for its own with these functions, and
// cmd/eoskit looks for everyone's.
package txnscan

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf16"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// OffsetsTopic is where groups keep their offsets, and where a transaction's
// offset commit waits for its marker.
const OffsetsTopic = "__consumer_offsets"

// ErrNoOffsetsTopic says the cluster lists no __consumer_offsets topic (no
// group has found its coordinator yet, or the cluster is not Apache Kafka).
var ErrNoOffsetsTopic = errors.New("no " + OffsetsTopic + " topic")

// Key names a transaction a partition holds open: a partition holds at most
// one per producer id.
type Key struct {
	ProducerID int64
	Topic      string
	Partition  int32
}

// Open returns the transactions open in set's partitions. A partition that
// could not be described (leaderless right after a bounce, say) may hold a
// hanging transaction: it fails the whole call rather than being skipped.
func Open(ctx context.Context, adm *kadm.Client, set kadm.TopicsSet) (map[Key]kadm.DescribedProducer, error) {
	described, err := adm.DescribeProducers(ctx, set)
	if err != nil {
		return nil, fmt.Errorf("describe producers: %w", err)
	}
	var partErr error
	described.EachPartition(func(p kadm.DescribedProducersPartition) {
		if p.Err != nil {
			partErr = errors.Join(partErr, fmt.Errorf("describe producers of %s[%d]: %w", p.Topic, p.Partition, p.Err))
		}
	})
	if partErr != nil {
		return nil, partErr
	}
	open := map[Key]kadm.DescribedProducer{}
	described.EachProducer(func(p kadm.DescribedProducer) {
		if p.CurrentTxnStartOffset >= 0 {
			open[Key{p.ProducerID, p.Topic, p.Partition}] = p
		}
	})
	return open, nil
}

// State is what a partition's open transaction is, in its coordinator's
// eyes.
type State int

const (
	// Live: the coordinator is in that transaction.
	Live State = iota
	// Ending: the coordinator is writing its markers (Prepare*): look
	// again shortly.
	Ending
	// Hanging: the coordinator has moved on; no marker will come.
	Hanging
)

func (s State) String() string {
	return [...]string{"live", "ending", "hanging"}[s]
}

// Classify says what the transaction p (open in its partition) is, given
// coord, the coordinator's state for the transactional id that holds p's
// producer id. A coordinator on another producer id has moved on, and so
// has one that is not in a transaction at p's epoch, or is in one that does
// not list p's partition (the coordinator writes markers to the partitions
// it lists, and only to those: a dropped partition, KAFKA-20734, is left
// open for good). kafka-transactions.sh find-hanging checks the same.
func Classify(coord kadm.DescribedTransaction, p kadm.DescribedProducer) State {
	switch {
	case coord.ProducerID != p.ProducerID:
		return Hanging
	case coord.State == "PrepareCommit" || coord.State == "PrepareAbort" || coord.State == "PrepareEpochFence":
		return Ending
	case coord.State == "Ongoing" && coord.ProducerEpoch == p.ProducerEpoch:
		if _, listed := coord.Topics[p.Topic][p.Partition]; listed {
			return Live
		}
	}
	return Hanging
}

// CoordinatorOutcome reads, from the coordinator's state for the
// transactional id, how its transaction at epoch ended, when the state
// tells. With transaction protocol v2 every transaction has its epoch, and
// ending it bumps the coordinator's epoch: CompleteCommit or CompleteAbort
// one epoch later is that transaction's outcome. A coordinator still at
// that epoch and not in a transaction (Empty, or Complete* from the one
// before) never registered it, let alone prepared its commit: a partition
// accepts transactional data only after the coordinator registered the
// partition, so such a transaction exists only because the coordinator
// lost it (a broker killed mid-transaction), and only aborting matches
// what the coordinator knows. Anything else (a later epoch) says nothing.
// Only a client that speaks protocol v2 gets an epoch per transaction, and
// a cluster that offers v2 still serves v1 to older clients (Java before
// 4.0, librdkafka, franz-go capped with MaxVersions), whose epoch moves on
// when they register again (a restart), not per transaction: then none of
// these answers holds. Call it only for a producer known to speak v2.
func CoordinatorOutcome(coord kadm.DescribedTransaction, epoch int16) (commit, known bool) {
	switch {
	case coord.ProducerEpoch == epoch+1 && coord.State == "CompleteCommit":
		return true, true
	case coord.ProducerEpoch == epoch+1 && coord.State == "CompleteAbort":
		return false, true
	case coord.ProducerEpoch == epoch && (coord.State == "Empty" || coord.State == "CompleteCommit" || coord.State == "CompleteAbort"):
		return false, true
	}
	return false, false
}

// OutcomeName names a known outcome as findings and metrics do:
// "committed" or "aborted".
func OutcomeName(commit bool) string {
	if commit {
		return "committed"
	}
	return "aborted"
}

// ErrRecordsGone is why [MarkerAfter] cannot say how a transaction
// ended: its first record in the partition is no longer there. It was
// deleted (retention by age, DeleteRecords, a purged repartition topic,
// compaction) or lost (a leader that lost records, the log truncated and
// maybe written again), and a marker read further on may close another
// transaction of the producer.
var ErrRecordsGone = errors.New("the transaction's first record is gone from the partition (deleted or lost): its marker cannot be told")

// MarkerAfter reads topic's partition from offset from, the first record
// the transaction of producer id at epoch wrote there, read_uncommitted with
// control records, for the producer's first transaction marker after it,
// and says whether it commits. clientOpts reach the cluster (seed
// brokers, TLS, SASL). The record at from must still be there and be the
// producer's at that epoch: when the partition starts past from, ends at or before it,
// is out of range while read, lost records meanwhile, or holds another
// record at from (compacted away, or the log truncated and written
// again), it returns an error wrapping [ErrRecordsGone]: the first marker
// found would be another transaction's. found is false when the
// partition holds no marker of the producer after from yet. Any other
// fetch error is returned. It gives up after 30 s.
func MarkerAfter(ctx context.Context, adm *kadm.Client, clientOpts []kgo.Opt, topic string, partition int32, from, id int64, epoch int16) (commit, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	where := fmt.Sprintf("%s[%d]", topic, partition)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return false, false, fmt.Errorf("end offset of %s: %w", where, err)
	}
	end, ok := ends.Lookup(topic, partition)
	switch {
	case !ok:
		return false, false, fmt.Errorf("end offset of %s: not listed", where)
	case end.Err != nil:
		return false, false, fmt.Errorf("end offset of %s: %w", where, end.Err)
	case end.Offset <= from:
		return false, false, fmt.Errorf("%s ends at %d, at or before the transaction's first record at %d: %w", where, end.Offset, from, ErrRecordsGone)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return false, false, fmt.Errorf("start offset of %s: %w", where, err)
	}
	switch start, ok := starts.Lookup(topic, partition); {
	case !ok:
		return false, false, fmt.Errorf("start offset of %s: not listed", where)
	case start.Err != nil:
		return false, false, fmt.Errorf("start offset of %s: %w", where, start.Err)
	case start.Offset > from:
		return false, false, fmt.Errorf("%s starts at %d, past the transaction's first record at %d: %w", where, start.Offset, from, ErrRecordsGone)
	}
	opts := append(slices.Clip(clientOpts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords(),
		// Deleted meanwhile: an error, never a read from the log's start.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return false, false, err
	}
	defer cl.Close()
	first := true // the next record must be the transaction's first, at from
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return false, false, fmt.Errorf("read %s from %d: %w", where, from, err)
		}
		for _, fe := range fetches.Errors() {
			var lost *kgo.ErrDataLoss
			switch {
			case errors.Is(fe.Err, kerr.OffsetOutOfRange), errors.As(fe.Err, &lost):
				return false, false, fmt.Errorf("read %s from %d: %w: %w", where, from, ErrRecordsGone, fe.Err)
			default:
				return false, false, fmt.Errorf("read %s from %d: %w", where, from, fe.Err)
			}
		}
		var stop error
		done := false
		fetches.EachRecord(func(r *kgo.Record) {
			switch {
			case done:
			case first && (r.Offset != from || r.ProducerID != id || r.ProducerEpoch != epoch || r.Attrs.IsControl()):
				// Clamped to the log's start, compacted, or written
				// again (by another producer, or a later transaction
				// of this one): not the record the transaction wrote.
				stop, done = fmt.Errorf("%s holds at %d (from %d) a record of producer id %d at epoch %d, not this transaction's first (epoch %d): %w",
					where, r.Offset, from, r.ProducerID, r.ProducerEpoch, epoch, ErrRecordsGone), true
			case r.Attrs.IsControl() && r.ProducerID == id:
				// A control record's key is version, then type: 0 abort,
				// 1 commit.
				if len(r.Key) < 4 || binary.BigEndian.Uint16(r.Key[2:4]) > 1 {
					stop, done = fmt.Errorf("%s holds at %d a control record of producer id %d that is neither a commit nor an abort (key %x)", where, r.Offset, id, r.Key), true
					break
				}
				commit, found, done = binary.BigEndian.Uint16(r.Key[2:4]) == 1, true, true
			case r.Offset+1 >= end.Offset:
				done = true
			}
			first = false
		})
		if done {
			return commit, found, stop
		}
	}
}

// OffsetsPartition returns the partition of __consumer_offsets that holds
// group's offsets, as the broker picks it (see [GroupPartition]).
func OffsetsPartition(ctx context.Context, adm *kadm.Client, group string) (int32, error) {
	topics, err := adm.ListTopics(ctx, OffsetsTopic)
	if err != nil {
		return 0, fmt.Errorf("metadata of %s: %w", OffsetsTopic, err)
	}
	d, ok := topics[OffsetsTopic]
	switch {
	case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
		return 0, ErrNoOffsetsTopic
	case d.Err != nil || len(d.Partitions) == 0:
		return 0, fmt.Errorf("metadata of %s: %v", OffsetsTopic, d.Err)
	}
	return GroupPartition(group, int32(len(d.Partitions))), nil
}

// GroupPartition is the partition of an offsets topic of that many
// partitions that holds group's offsets: Kafka's
// Utils.abs(groupId.hashCode()) % partitions
// (GroupCoordinatorService.partitionFor). Utils.abs is Math.abs with
// Integer.MIN_VALUE mapped to 0; masking the sign bit instead
// (hash & 0x7fffffff, as Kafka's producer partitioner does) picks another
// partition for every negative hash, about half of all names.
func GroupPartition(group string, partitions int32) int32 {
	h := JavaStringHash(group)
	switch {
	case h == math.MinInt32:
		h = 0
	case h < 0:
		h = -h
	}
	return h % partitions
}

// JavaStringHash is Java's String.hashCode: over UTF-16 code units, with
// int32 overflow.
func JavaStringHash(s string) int32 {
	var h int32
	for _, u := range utf16.Encode([]rune(s)) {
		h = 31*h + int32(u)
	}
	return h
}

// TransactionVersion reads the cluster's finalized transaction.version (0
// when it lists none: transaction protocol v1).
func TransactionVersion(ctx context.Context, cl *kgo.Client) (int16, error) {
	versions, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(versions.ErrorCode)
	}
	if err != nil {
		return 0, fmt.Errorf("read the cluster's transaction.version: %w", err)
	}
	var level int16
	for _, f := range versions.FinalizedFeatures {
		if f.Name == "transaction.version" {
			level = f.MaxVersionLevel
		}
	}
	return level, nil
}

// IsUnsupportedError reports whether err says the broker does not know a
// request (franz-go's errors for that are not exported).
func IsUnsupportedError(err error) bool {
	if errors.Is(err, kerr.UnsupportedVersion) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "broker is too old") || strings.Contains(msg, "request key is unknown")
}

// IsAuthError reports whether err is a refusal for want of an ACL.
func IsAuthError(err error) bool {
	var ae *kadm.AuthError
	return errors.As(err, &ae) ||
		errors.Is(err, kerr.ClusterAuthorizationFailed) ||
		errors.Is(err, kerr.TopicAuthorizationFailed) ||
		errors.Is(err, kerr.TransactionalIDAuthorizationFailed)
}
