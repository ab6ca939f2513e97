package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eostest"
	"github.com/eoskit/eoskit/internal/txnscan"
)

// KafkaBrokersEnv names the environment variable with the bootstrap
// addresses of a running broker.
const KafkaBrokersEnv = eostest.KafkaBrokersEnv

const kafkaHowTo = "Run `make test` (it starts a local broker with scripts/kafka.sh), " +
	"or start one with `scripts/kafka.sh start` and export the KAFKA_BROKERS it prints, " +
	"or start Docker (eostest runs a container then)."

// KafkaCluster is a handle on a real Kafka cluster for one test.
type KafkaCluster struct {
	// Brokers are the bootstrap addresses.
	Brokers []string
	// Admin is an admin client on the cluster, closed when the test ends.
	Admin *kadm.Client

	tb testing.TB
	// conn reaches the cluster as the harness: the seed brokers, and on
	// a broker with ACLs its super user's SASL credentials.
	conn []kgo.Opt
}

// connOpts are the options that reach brokers with no credentials.
func connOpts(brokers []string) []kgo.Opt { return []kgo.Opt{kgo.SeedBrokers(brokers...)} }

// Kafka returns a handle on a real Kafka cluster, from KAFKA_BROKERS or
// else a broker container started for tb ([eostest.Kafka]), and skips (or,
// with EOS_REQUIRE_SERVICES=1, fails) tb when neither is available.
func Kafka(tb testing.TB) *KafkaCluster {
	tb.Helper()
	return newKafkaCluster(tb, eostest.Kafka(tb))
}

func newKafkaCluster(tb testing.TB, brokers []string, extra ...kgo.Opt) *KafkaCluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := append(connOpts(brokers), extra...)
	if err := waitForKafka(ctx, conn); err != nil {
		missingService(tb, "Kafka", kafkaHowTo, fmt.Errorf("kafka at %s does not answer: %w", strings.Join(brokers, ","), err))
	}
	k := &KafkaCluster{Brokers: brokers, tb: tb, conn: conn}
	k.Admin = kadm.NewClient(k.Client())
	return k
}

// waitForKafka returns once the cluster answers Metadata with at least one
// broker, retrying until ctx ends.
func waitForKafka(ctx context.Context, conn []kgo.Opt) error {
	cl, err := kgo.NewClient(conn...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for {
		md, err := adm.BrokerMetadata(ctx)
		if err == nil && len(md.Brokers) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = errors.New("metadata lists no broker")
			}
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Client returns a franz-go client seeded with the cluster's brokers and
// opts, closed when the test ends.
func (k *KafkaCluster) Client(opts ...kgo.Opt) *kgo.Client {
	k.tb.Helper()
	cl, err := kgo.NewClient(append(slices.Clip(k.conn), opts...)...)
	if err != nil {
		k.tb.Fatalf("integration: new kafka client: %v", err)
	}
	k.tb.Cleanup(cl.Close)
	return cl
}

var (
	unsafeTopicChars = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)
	unsafeIdentChars = regexp.MustCompile(`[^a-zA-Z0-9_]+`)
)

// UniqueName returns prefix joined with the test's name and a random suffix,
// safe as a Kafka topic, group or transactional id, so that tests sharing a
// broker never meet.
func UniqueName(tb testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := unsafeTopicChars.ReplaceAllString(tb.Name(), "_")
	if len(name) > 120 {
		name = name[len(name)-120:]
	}
	return prefix + "-" + name + "-" + hex.EncodeToString(b[:])
}

// NewTopic creates a topic with a unique name and the given number of
// partitions (the cluster's default replication factor: 1 on one broker, 3
// on the local cluster), deletes it when the test ends, and returns its
// name.
func (k *KafkaCluster) NewTopic(partitions int32) string {
	k.tb.Helper()
	topic := UniqueName(k.tb, "t")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := k.Admin.CreateTopic(ctx, partitions, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		k.tb.Fatalf("integration: create topic %s: %v", topic, err)
	}
	k.tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = k.Admin.DeleteTopics(ctx, topic)
	})
	return topic
}

// ReadAll waits until no transaction is open on topic (its last stable
// offset has caught up with its high watermark), then reads every record of
// it at the given isolation level: under read_committed an aborted record
// never appears. Waiting matters because a commit's markers are written
// after EndTxn returns, so a read right after a commit may not see it yet.
// It fails the test if a transaction stays open, or the records can not be
// read, within timeout. Records come in offset order within each partition.
func (k *KafkaCluster) ReadAll(topic string, level kgo.IsolationLevel, timeout time.Duration) []*kgo.Record {
	k.tb.Helper()
	recs, err := readTopic(context.Background(), k.conn, topic, level, true, false, timeout)
	if err != nil {
		k.tb.Fatalf("integration: %v", err)
	}
	return recs
}

// ReadNow reads what topic holds at the given isolation level right now,
// without waiting for open transactions: up to the high watermark under
// read_uncommitted, up to the last stable offset under read_committed.
func (k *KafkaCluster) ReadNow(topic string, level kgo.IsolationLevel, timeout time.Duration) []*kgo.Record {
	k.tb.Helper()
	recs, err := readTopic(context.Background(), k.conn, topic, level, false, false, timeout)
	if err != nil {
		k.tb.Fatalf("integration: %v", err)
	}
	return recs
}

// ReadRaw waits like [KafkaCluster.ReadAll], then reads every record of topic
// under read_uncommitted, control records (commit and abort markers)
// included: the input [AbortedPositions] needs.
func (k *KafkaCluster) ReadRaw(topic string, timeout time.Duration) []*kgo.Record {
	k.tb.Helper()
	recs, err := readTopic(context.Background(), k.conn, topic, kgo.ReadUncommitted(), true, true, timeout)
	if err != nil {
		k.tb.Fatalf("integration: %v", err)
	}
	return recs
}

// ReadRawTopic is [KafkaCluster.ReadRaw] for programs that have no
// testing.TB.
func ReadRawTopic(ctx context.Context, brokers []string, topic string, timeout time.Duration) ([]*kgo.Record, error) {
	return readTopic(ctx, connOpts(brokers), topic, kgo.ReadUncommitted(), true, true, timeout)
}

// ReadTopic is [KafkaCluster.ReadAll] (settled) or [KafkaCluster.ReadNow]
// for programs that have no testing.TB.
func ReadTopic(ctx context.Context, brokers []string, topic string, level kgo.IsolationLevel, settled bool, timeout time.Duration) ([]*kgo.Record, error) {
	return readTopic(ctx, connOpts(brokers), topic, level, settled, false, timeout)
}

func readTopic(ctx context.Context, conn []kgo.Opt, topic string, level kgo.IsolationLevel, settled, keepControl bool, timeout time.Duration) ([]*kgo.Record, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	admCl, err := kgo.NewClient(conn...)
	if err != nil {
		return nil, err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)

	if settled {
		if err := waitSettled(ctx, adm, topic); err != nil {
			return nil, err
		}
	}
	listEnds := adm.ListEndOffsets
	if level == kgo.ReadCommitted() {
		listEnds = adm.ListCommittedOffsets
	}
	ends, err := listEnds(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: list end offsets: %w", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: list start offsets: %w", topic, err)
	}

	// next[p] is the offset ReadTopic has read up to; partition p is done
	// when it reaches the end. Control records are kept so that a partition
	// ending in a commit or abort marker still reaches its end.
	next := map[int32]int64{}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		end[o.Partition] = o.Offset
		next[o.Partition] = 0
	})
	starts.Each(func(o kadm.ListedOffset) { next[o.Partition] = o.Offset })
	pending := 0
	for p := range end {
		if next[p] < end[p] {
			pending++
		}
	}
	if pending == 0 {
		return nil, nil
	}

	cl, err := kgo.NewClient(append(slices.Clip(conn),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(level),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	var out []*kgo.Record
	for pending > 0 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return out, fmt.Errorf("read %s: %d partitions not read to their end (read up to %v of %v): %w",
				topic, pending, next, end, ctx.Err())
		}
		var fetchErr error
		fetches.EachError(func(_ string, _ int32, err error) { fetchErr = err })
		if fetchErr != nil {
			return out, fmt.Errorf("read %s: %w", topic, fetchErr)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end[r.Partition] {
				return
			}
			wasPending := next[r.Partition] < end[r.Partition]
			next[r.Partition] = r.Offset + 1
			if wasPending && next[r.Partition] >= end[r.Partition] {
				pending--
			}
			if keepControl || !r.Attrs.IsControl() {
				out = append(out, r)
			}
		})
	}
	return out, nil
}

// waitSettled returns once every partition's last stable offset equals its
// high watermark, that is once no transaction on topic is still undecided.
func waitSettled(ctx context.Context, adm *kadm.Client, topic string) error {
	var lso, hwm kadm.ListedOffsets
	for {
		var err error
		if hwm, err = adm.ListEndOffsets(ctx, topic); err == nil {
			err = hwm.Error()
		}
		if err == nil {
			if lso, err = adm.ListCommittedOffsets(ctx, topic); err == nil {
				err = lso.Error()
			}
		}
		if err == nil && offsetsEqual(lso, hwm) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("read %s: a transaction is still open (last stable offsets %v, high watermarks %v; last error %v): %w",
				topic, lso.Offsets(), hwm.Offsets(), err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func offsetsEqual(a, b kadm.ListedOffsets) bool {
	n, equal := 0, true
	b.Each(func(o kadm.ListedOffset) {
		n++
		if other, ok := a.Lookup(o.Topic, o.Partition); !ok || other.Offset != o.Offset {
			equal = false
		}
	})
	return n > 0 && equal
}

// TransactionVersion returns the cluster's finalized transaction.version:
// 2 is transaction protocol v2 (KIP-890, Kafka 4.x), below is v1 (Kafka
// 3.x), where an epoch spans many transactions.
func (k *KafkaCluster) TransactionVersion() int16 {
	k.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	level, err := txnscan.TransactionVersion(ctx, k.Client())
	if err != nil {
		k.tb.Fatalf("integration: %v", err)
	}
	return level
}
