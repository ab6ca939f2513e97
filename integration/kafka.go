package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/verify"
)

// KafkaCluster is a handle on a real Kafka cluster for one test.
type KafkaCluster struct {
	// Brokers are the bootstrap addresses.
	Brokers []string
	// Admin is an admin client on the cluster, closed when the test ends.
	Admin *kadm.Client

	tb testing.TB
	// conn reaches the cluster as the kit: the seed brokers, and the
	// options given to [KafkaAt] (a super user's SASL credentials, say).
	conn []kgo.Opt
}

// Kafka returns a handle on a real Kafka cluster for tb, from the first of:
// KAFKA_BROKERS; a broker container started for tb and terminated when it
// ends ([StartKafka]). With neither it skips tb, or fails it with
// EOS_REQUIRE_SERVICES=1; so does a KAFKA_BROKERS that does not answer
// within 30 s. A container that Docker runs but that does not come up
// fails tb.
func Kafka(tb testing.TB) *KafkaCluster {
	tb.Helper()
	brokers := KafkaBrokers(tb)
	k, err := connect(tb, brokers, nil)
	if err != nil {
		ServiceMissing(tb, "Kafka", kafkaHowTo, fmt.Errorf("kafka at %s does not answer: %w", strings.Join(brokers, ","), err))
	}
	return k
}

// KafkaBrokers is [Kafka] that returns the bootstrap addresses only, for
// code under test that makes its own clients.
func KafkaBrokers(tb testing.TB) []string {
	tb.Helper()
	if s := strings.TrimSpace(os.Getenv(KafkaBrokersEnv)); s != "" {
		brokers := strings.Split(s, ",")
		for i := range brokers {
			brokers[i] = strings.TrimSpace(brokers[i])
		}
		return brokers
	}
	return StartKafka(tb).Brokers()
}

// For returns a handle on k's cluster whose helpers fail tb rather than
// the test k was made for: a parallel subtest's own (its parent has
// returned by the time it runs, and failing the parent then would end
// the test binary). It shares k's admin client, closed when k's test
// ends.
func (k *KafkaCluster) For(tb testing.TB) *KafkaCluster {
	c := *k
	c.tb = tb
	return &c
}

// KafkaAt returns a handle on the cluster at brokers, reached with opts
// besides the seed brokers (SASL credentials, TLS), once it answers; it
// fails tb when it does not within 30 s.
func KafkaAt(tb testing.TB, brokers []string, opts ...kgo.Opt) *KafkaCluster {
	tb.Helper()
	k, err := connect(tb, brokers, opts)
	if err != nil {
		tb.Fatalf("integration: kafka at %s does not answer: %v", strings.Join(brokers, ","), err)
	}
	return k
}

func connect(tb testing.TB, brokers []string, opts []kgo.Opt) (*KafkaCluster, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)
	if err := waitForKafka(ctx, conn); err != nil {
		return nil, err
	}
	k := &KafkaCluster{Brokers: brokers, tb: tb, conn: conn}
	k.Admin = kadm.NewClient(k.Client())
	return k, nil
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

// Client returns a franz-go client on the cluster with opts, closed when
// the test ends.
func (k *KafkaCluster) Client(opts ...kgo.Opt) *kgo.Client {
	k.tb.Helper()
	cl, err := kgo.NewClient(append(slices.Clip(k.conn), opts...)...)
	if err != nil {
		k.tb.Fatalf("integration: new kafka client: %v", err)
	}
	k.tb.Cleanup(cl.Close)
	return cl
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
