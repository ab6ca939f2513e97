package testbed

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/internal/txnscan"
)

// These helpers build, with raw requests, the broker states that a crash
// or a broker bounce leaves behind, so that a test can put a processor in
// front of them.

// LeaveOpenTransactionWithOffsets leaves what a producer that dies
// mid-commit leaves: a transaction under txnID holding an offset commit of
// offset for partition 0 of topic in, never ended.
func LeaveOpenTransactionWithOffsets(t testing.TB, k *integration.KafkaCluster, txnID, group, in string, offset int64, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createGroupAtStart(ctx, t, k, group, in)
	leaveOpenTransaction(ctx, t, k, txnID, group, in, offset, timeout)
	RequireUnstable(ctx, t, k, group, in)
}

// LeaveOpenFirstCommit is [LeaveOpenTransactionWithOffsets]
// for a group that never committed: its first offset commit, for
// partition 0 of in, stays pending in a transaction never ended. Kafka
// lists no offset for such a partition when asked for all of a group's
// offsets, stable or not; only a fetch that names the partition says it
// is pending.
func LeaveOpenFirstCommit(t testing.TB, k *integration.KafkaCluster, txnID, group, in string, offset int64, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leaveOpenTransaction(ctx, t, k, txnID, group, in, offset, timeout)
}

func leaveOpenTransaction(ctx context.Context, t testing.TB, k *integration.KafkaCluster, txnID, group, in string, offset int64, timeout time.Duration) {
	t.Helper()
	cl := k.Client()
	pid, epoch := initProducerID(ctx, t, cl, txnID, timeout)
	addReq := kmsg.NewPtrAddOffsetsToTxnRequest()
	addReq.TransactionalID, addReq.ProducerID, addReq.ProducerEpoch, addReq.Group = txnID, pid, epoch, group
	addResp, err := addReq.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("AddOffsetsToTxn: %v", err)
	}
	txnOffsetCommit(ctx, t, k, cl, txnID, pid, epoch, group, in, offset)
}

// How a hanging transaction's coordinator last saw it.
type HangingEnd int

const (
	HangCommitted HangingEnd = iota // ended with a commit
	HangAborted                     // ended with an abort
	HangForgotten                   // never registered: the coordinator lost it
)

// LeaveHangingTransaction leaves what Kafka 4.4 left in the chaos suite
// after broker bounces: a transaction of txnID whose coordinator ended it
// (CompleteCommit or CompleteAbort one epoch later) or never knew it (still
// at its epoch, Empty), while the group's offsets partition still holds its
// offset commit (offset for partition 0 of topic in) pending, with no
// marker ever to come. It works on a private broker and on a private
// cluster alike (the offset commit goes to the group's coordinator, in the
// group's own offsets partition). To get there without a bounce, the broker's transaction
// verification (KIP-890) is turned off and the offset commit goes in at a
// pre-KIP-890 version without AddOffsetsToTxn, so the coordinator never
// learns of the offsets partition. The transaction also writes one record
// to side, so that it has something to end. The config change is
// cluster-wide: use a private broker or cluster.
func LeaveHangingTransaction(t testing.TB, k *integration.KafkaCluster, txnID, group, in, side string, offset int64, end HangingEnd) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createGroupAtStart(ctx, t, k, group, in)
	resp, err := k.Admin.AlterBrokerConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "transaction.partition.verification.enable", Value: kadm.StringPtr("false")}})
	if err == nil {
		for _, r := range resp {
			err = errors.Join(err, r.Err)
		}
	}
	if err != nil {
		t.Fatalf("turn transaction verification off: %v", err)
	}
	producer := k.Client(kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(side))
	old := k.Client(kgo.MaxVersions(kversion.V3_5_0()))
	if end == HangForgotten {
		pid, epoch, err := producer.ProducerID(ctx)
		if err != nil {
			t.Fatalf("ProducerID: %v", err)
		}
		for attempt := 0; ; attempt++ {
			err := tryTxnOffsetCommit(ctx, k, old, txnID, pid, epoch, group, in, offset)
			if err == nil {
				break
			}
			if !errors.Is(err, kerr.InvalidTxnState) || attempt == 50 {
				t.Fatalf("TxnOffsetCommit without AddOffsetsToTxn: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		described, err := k.Admin.DescribeTransactions(ctx, txnID)
		if err != nil {
			t.Fatalf("DescribeTransactions: %v", err)
		}
		if d := described[txnID]; d.State != "Empty" || d.ProducerEpoch != epoch {
			t.Fatalf("the coordinator is %s at epoch %d, want Empty at %d", d.State, d.ProducerEpoch, epoch)
		}
		RequireUnstable(ctx, t, k, group, in)
		return
	}
	commit := end == HangCommitted
	for attempt := 0; ; attempt++ {
		if err := producer.BeginTransaction(); err != nil {
			t.Fatalf("BeginTransaction: %v", err)
		}
		if err := producer.ProduceSync(ctx, &kgo.Record{Value: []byte("predecessor")}).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
		pid, epoch, err := producer.ProducerID(ctx)
		if err != nil {
			t.Fatalf("ProducerID: %v", err)
		}
		err = tryTxnOffsetCommit(ctx, k, old, txnID, pid, epoch, group, in, offset)
		if err == nil {
			break
		}
		// The config change reaches the broker through its metadata log.
		if !errors.Is(err, kerr.InvalidTxnState) || attempt == 50 {
			t.Fatalf("TxnOffsetCommit without AddOffsetsToTxn: %v", err)
		}
		if err := producer.EndTransaction(ctx, kgo.TryAbort); err != nil {
			t.Fatalf("EndTransaction: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := producer.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatalf("EndTransaction: %v", err)
	}
	// EndTxn answers before the markers are written: wait for them.
	want := map[bool]string{true: "CompleteCommit", false: "CompleteAbort"}[commit]
	for state := ""; state != want; time.Sleep(100 * time.Millisecond) {
		described, err := k.Admin.DescribeTransactions(ctx, txnID)
		if err != nil {
			t.Fatalf("DescribeTransactions: %v", err)
		}
		state = described[txnID].State
		if state != "PrepareCommit" && state != "PrepareAbort" && state != want {
			t.Fatalf("the transaction is %s at the coordinator, want %s", state, want)
		}
	}
	RequireUnstable(ctx, t, k, group, in)
}

// createGroupAtStart commits offset 0 for every partition of topic: the
// group must exist, with committed offsets, for the broker to report
// pending ones, and offset 0 changes nothing.
func createGroupAtStart(ctx context.Context, t testing.TB, k *integration.KafkaCluster, group, topic string) {
	t.Helper()
	ends, err := k.Admin.ListStartOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("ListStartOffsets: %v", err)
	}
	if _, err := k.Admin.CommitOffsets(ctx, group, ends.Offsets()); err != nil {
		t.Fatalf("CommitOffsets: %v", err)
	}
}

// initProducerID registers txnID, retrying while the coordinator is still
// finishing what came before.
func initProducerID(ctx context.Context, t testing.TB, cl *kgo.Client, txnID string, timeout time.Duration) (int64, int16) {
	t.Helper()
	req := kmsg.NewPtrInitProducerIDRequest()
	req.TransactionalID = &txnID
	req.TransactionTimeoutMillis = int32(timeout.Milliseconds())
	for {
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		switch {
		case err == nil:
			return resp.ProducerID, resp.ProducerEpoch
		case errors.Is(err, kerr.ConcurrentTransactions) || errors.Is(err, kerr.CoordinatorLoadInProgress):
			time.Sleep(50 * time.Millisecond)
		default:
			t.Fatalf("InitProducerID: %v", err)
		}
	}
}

// txnOffsetCommit commits offset for partition 0 of topic in the open
// transaction of pid and epoch.
func txnOffsetCommit(ctx context.Context, t testing.TB, k *integration.KafkaCluster, cl *kgo.Client, txnID string, pid int64, epoch int16, group, topic string, offset int64) {
	t.Helper()
	if err := tryTxnOffsetCommit(ctx, k, cl, txnID, pid, epoch, group, topic, offset); err != nil {
		t.Fatalf("TxnOffsetCommit: %v", err)
	}
}

func tryTxnOffsetCommit(ctx context.Context, k *integration.KafkaCluster, cl *kgo.Client, txnID string, pid int64, epoch int16, group, topic string, offset int64) error {
	details, err := k.Admin.ListTopics(ctx, topic)
	if err == nil {
		err = details.Error()
	}
	if err != nil {
		return err
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = txnID, group, pid, epoch
	req.Generation, req.MemberID = -1, ""
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = topic, details[topic].ID // v6+ names topics by id
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset = 0, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		for _, tp := range resp.Topics {
			for _, p := range tp.Partitions {
				err = errors.Join(err, kerr.ErrorForCode(p.ErrorCode))
			}
		}
	}
	return err
}

// RequireUnstable fails t unless the group's offset for partition 0 of
// topic is pending: the state the processor must get out of.
func RequireUnstable(ctx context.Context, t testing.TB, k *integration.KafkaCluster, group, topic string) {
	t.Helper()
	fetched, err := k.Admin.FetchOffsets(kadm.RequireStable(ctx), group)
	if err != nil {
		t.Fatalf("FetchOffsets: %v", err)
	}
	if o, ok := fetched.Lookup(topic, 0); !ok || !errors.Is(o.Err, kerr.UnstableOffsetCommit) {
		t.Fatalf("the offset commit is not pending: OffsetFetch answered %+v", fetched)
	}
}

// OpenTransactions lists the transactions that the partitions of topics
// (empty names skipped) and of __consumer_offsets (if it exists) hold open, as "topic[p] producer N epoch E since
// offset O". A partition that cannot be described (its leader moving after
// a bounce) is asked again until a minute has passed, then fails t: it must
// not pass for one with nothing open.
func OpenTransactions(t testing.TB, k *integration.KafkaCluster, topics ...string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := []string{txnscan.OffsetsTopic}
	for _, topic := range topics {
		if topic != "" { // a path with no output topic
			names = append(names, topic)
		}
	}
	listed, err := k.Admin.ListTopics(ctx, names...)
	if err == nil {
		// No group ever committed (the outbox relay has none): there
		// is no offsets topic to look at.
		if d, ok := listed[txnscan.OffsetsTopic]; ok && errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			delete(listed, txnscan.OffsetsTopic)
		}
		err = listed.Error()
	}
	if err != nil {
		t.Fatalf("testbed: list topics: %v", err)
	}
	open, err := txnscan.Open(ctx, k.Admin, listed.TopicsSet())
	for err != nil && ctx.Err() == nil {
		time.Sleep(500 * time.Millisecond)
		open, err = txnscan.Open(ctx, k.Admin, listed.TopicsSet())
	}
	if err != nil {
		t.Fatalf("testbed: describe producers: %v", err)
	}
	var out []string
	for _, p := range open {
		out = append(out, fmt.Sprintf("%s[%d] producer %d epoch %d since offset %d", p.Topic, p.Partition, p.ProducerID, p.ProducerEpoch, p.CurrentTxnStartOffset))
	}
	return out
}

// TransactionVersion returns the cluster's finalized transaction.version:
// 2 is transaction protocol v2 (KIP-890, Kafka 4.x), below is v1 (Kafka
// 3.x), where an epoch spans many transactions.
func TransactionVersion(tb testing.TB, k *integration.KafkaCluster) int16 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	level, err := txnscan.TransactionVersion(ctx, k.Client())
	if err != nil {
		tb.Fatalf("testbed: %v", err)
	}
	return level
}
