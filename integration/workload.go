package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/verify"
)

// The copy workload: every input record carries a unique id as its key and
// value; a copier's output record carries, in its value, the id and the
// input's partition and offset ("id|partition|offset"), which is what
// [Verify] needs to check loss, duplication and per-partition order.

// Seed writes n input records with ids "in-0" .. "in-(n-1)" to topic,
// spread over its partitions by key, with an idempotent producer, and
// returns the ids in the order written. It fails the test when they are
// not all acknowledged within seedTimeout (a missing topic, a broker
// gone: franz-go would retry for ever).
func (k *KafkaCluster) Seed(topic string, n int) []string {
	k.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), seedTimeout)
	defer cancel()
	ids, err := seedTopic(ctx, k.conn, topic, n)
	if err != nil {
		k.tb.Fatalf("integration: %v", err)
	}
	return ids
}

// seedTimeout bounds a Seed.
const seedTimeout = 2 * time.Minute

// Inputs are what a hostile seed wrote: the committed ids in the order
// written, and the ids written only by transactions that aborted.
type Inputs struct {
	Committed []string
	Aborted   []string
}

// SeedHostile is [SeedTransactional] for tests: n committed records in
// transactions of batch, each followed by an aborted one of batch records
// (the last too, when n is not a multiple of batch), spread over the
// topic's partitions. Check outputs with
// [KafkaCluster.VerifyInputs], which counts an aborted id in the output as
// aborted-visible.
func (k *KafkaCluster) SeedHostile(topic string, n, batch int) Inputs {
	k.tb.Helper()
	// Two transactions a batch: on a loaded three-node cluster a
	// transaction's markers take a second or more.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	committed, aborted, err := seedTransactional(ctx, k.conn, topic, n, batch, nil)
	if err != nil {
		k.tb.Fatalf("integration: %v", err)
	}
	return Inputs{Committed: committed, Aborted: aborted}
}

// SeedTopic is [KafkaCluster.Seed] for programs that have no testing.TB.
func SeedTopic(ctx context.Context, brokers []string, topic string, n int) ([]string, error) {
	return seedTopic(ctx, []kgo.Opt{kgo.SeedBrokers(brokers...)}, topic, n)
}

func seedTopic(ctx context.Context, conn []kgo.Opt, topic string, n int) ([]string, error) {
	cl, err := kgo.NewClient(append(slices.Clip(conn), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ids := make([]string, n)
	errc := make(chan error, 1)
	for i := range ids {
		ids[i] = "in-" + strconv.Itoa(i)
		cl.Produce(ctx, &kgo.Record{Key: []byte(ids[i]), Value: []byte(ids[i])}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return nil, fmt.Errorf("seed %s: %w", topic, err)
	}
	select {
	case err := <-errc:
		return nil, fmt.Errorf("seed %s: %w", topic, err)
	default:
	}
	return ids, nil
}

// SeedTransactional writes n input records with ids "in-0" .. "in-(n-1)"
// to topic as a transactional producer upstream would (an eos.Processor,
// Kafka Streams, Flink): in transactions of batch records spread over the
// topic's partitions by key, each committed one followed by one that
// writes batch records with ids "aborted-0", "aborted-1", ... and aborts.
// The aborted records are in the log, flushed before the abort, so a
// read_uncommitted consumer sees them and a read_committed one must not.
// decorate, when not nil, changes each record before it is produced (to
// stamp a message id, say). It returns the committed ids in the order
// written, and the aborted ids: give both to [Verify] (Run.AbortedInput).
func SeedTransactional(ctx context.Context, brokers []string, topic string, n, batch int, decorate func(*kgo.Record)) (committed, aborted []string, err error) {
	return seedTransactional(ctx, []kgo.Opt{kgo.SeedBrokers(brokers...)}, topic, n, batch, decorate)
}

func seedTransactional(ctx context.Context, conn []kgo.Opt, topic string, n, batch int, decorate func(*kgo.Record)) (committed, aborted []string, err error) {
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	cl, err := kgo.NewClient(append(slices.Clip(conn), kgo.DefaultProduceTopic(topic),
		kgo.TransactionalID("eoskit-seed-"+topic+"-"+hex.EncodeToString(suffix[:])), kgo.ProducerLinger(5*time.Millisecond))...)
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	write := func(ids []string, commit bool) error {
		if err := cl.BeginTransaction(); err != nil {
			return err
		}
		var failed kgo.FirstErrPromise // Err waits for every promise
		for _, id := range ids {
			r := &kgo.Record{Key: []byte(id), Value: []byte(id)}
			if decorate != nil {
				decorate(r)
			}
			cl.Produce(ctx, r, failed.Promise())
		}
		if err := cl.Flush(ctx); err != nil {
			return err
		}
		if err := failed.Err(); err != nil {
			_ = cl.EndTransaction(ctx, kgo.TryAbort)
			return err
		}
		return cl.EndTransaction(ctx, kgo.TransactionEndTry(commit))
	}
	for start := 0; start < n; start += batch {
		ids := make([]string, 0, batch)
		for i := start; i < min(start+batch, n); i++ {
			ids = append(ids, "in-"+strconv.Itoa(i))
		}
		if err := write(ids, true); err != nil {
			return nil, nil, fmt.Errorf("seed %s: committed transaction: %w", topic, err)
		}
		committed = append(committed, ids...)
		ids = ids[:0]
		for range batch {
			ids = append(ids, "aborted-"+strconv.Itoa(len(aborted)+len(ids)))
		}
		if err := write(ids, false); err != nil {
			return nil, nil, fmt.Errorf("seed %s: aborted transaction: %w", topic, err)
		}
		aborted = append(aborted, ids...)
	}
	return committed, aborted, nil
}

// VerifyTopic reads output (settled, both committed and raw) and checks it
// against the inputs, failing the test with the report if any anomaly shows.
// It returns the report for further assertions.
func (k *KafkaCluster) VerifyTopic(inputs []string, output string, timeout time.Duration) verify.Report {
	k.tb.Helper()
	return k.VerifyInputs(Inputs{Committed: inputs}, output, timeout)
}

// VerifyInputs is [KafkaCluster.VerifyTopic] for inputs that a hostile seed
// wrote: an output of an aborted input is aborted-visible.
func (k *KafkaCluster) VerifyInputs(in Inputs, output string, timeout time.Duration) verify.Report {
	k.tb.Helper()
	rep := k.checkInputs(in, output, timeout)
	if err := rep.Err(); err != nil {
		k.tb.Fatal(err)
	}
	return rep
}

// CheckTopic is [KafkaCluster.VerifyTopic] without failing: for tests that
// expect anomalies (a weaker semantics under a fault).
func (k *KafkaCluster) CheckTopic(inputs []string, output string, timeout time.Duration) verify.Report {
	k.tb.Helper()
	return k.checkInputs(Inputs{Committed: inputs}, output, timeout)
}

func (k *KafkaCluster) checkInputs(in Inputs, output string, timeout time.Duration) verify.Report {
	k.tb.Helper()
	// One deadline for both reads: timeout bounds the whole check.
	deadline := time.Now().Add(timeout)
	committed := k.ReadAll(output, kgo.ReadCommitted(), time.Until(deadline))
	outs, err := verify.DecodeOutputs(committed)
	if err != nil {
		k.tb.Fatalf("integration: %v", err)
	}
	return verify.Check(verify.Run{Input: in.Committed, AbortedInput: in.Aborted, Output: outs, Aborted: verify.AbortedPositions(k.ReadRaw(output, max(time.Until(deadline), time.Second)))})
}
