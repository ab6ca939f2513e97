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
	"github.com/eoskit/eoskit/verify"
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

// UniqueNegativeHashName is [UniqueName] for a name whose Java
// String.hashCode is negative, and so is that of each name derived from it
// (the transactional id a processor derives from its group, say). Kafka
// places a group's offsets and a transactional id's state by that hash
// (Utils.abs(hash) % partitions): about half of all names hash negative,
// and code that gets the sign wrong looks in the wrong partition for
// exactly these.
func UniqueNegativeHashName(tb testing.TB, prefix string, derived ...func(string) string) string {
	tb.Helper()
	for range 10_000 {
		name := UniqueName(tb, prefix)
		ok := txnscan.JavaStringHash(name) < 0
		for _, d := range derived {
			ok = ok && txnscan.JavaStringHash(d(name)) < 0
		}
		if ok {
			return name
		}
	}
	tb.Fatalf("integration: no name with prefix %q hashes negative", prefix)
	return ""
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
	recs, err := verify.ReadTopicWith(context.Background(), k.conn, topic, level, true, false, timeout)
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
	recs, err := verify.ReadTopicWith(context.Background(), k.conn, topic, level, false, false, timeout)
	if err != nil {
		k.tb.Fatalf("integration: %v", err)
	}
	return recs
}

// ReadRaw waits like [KafkaCluster.ReadAll], then reads every record of topic
// under read_uncommitted, control records (commit and abort markers)
// included: the input [verify.AbortedPositions] needs.
func (k *KafkaCluster) ReadRaw(topic string, timeout time.Duration) []*kgo.Record {
	k.tb.Helper()
	recs, err := verify.ReadTopicWith(context.Background(), k.conn, topic, kgo.ReadUncommitted(), true, true, timeout)
	if err != nil {
		k.tb.Fatalf("integration: %v", err)
	}
	return recs
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
