package eos_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
)

// slowFailedPromises is a client hook that holds up the promise of every
// record that failed, as a slow metrics or tracing hook would: franz-go
// finishes a record that failed before it was buffered on another
// goroutine, and Flush does not wait for it.
type slowFailedPromises struct{ delay time.Duration }

func (h slowFailedPromises) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if err != nil {
		time.Sleep(h.delay)
	}
}

// One input's output is larger than MaxBufferedBytes, so franz-go fails it
// before buffering it, and its promise comes late (a hook holds it 2 s);
// the handler returns it after the batch's earlier outputs were
// acknowledged, so Flush has nothing to wait for. A batch must never commit
// before every output's promise returned: under DeadLetter the input must
// end in the dead-letter topic, once, and every other input in the output.
// Before the processor counted promises, the batch committed without the
// output and the input was lost, under both semantics that promise it.
func TestProcessorNeverCommitsBeforeEveryOutputIsSettled(t *testing.T) {
	t.Parallel()
	for _, sem := range []eos.Semantics{eos.ExactlyOnce, eos.AtLeastOnce} {
		t.Run(sem.String(), func(t *testing.T) {
			t.Parallel()
			k := integration.Kafka(t)
			in, out, dlt := k.NewTopic(1), k.NewTopic(1), k.NewTopic(1)
			group := integration.UniqueName(t, "g")
			const n, poison = 300, 299 // the last input: no output after it for Flush to wait for
			inputs := k.Seed(in, n)
			handler := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
				if r.Offset != poison {
					return copyHandler(out)(ctx, r)
				}
				time.Sleep(500 * time.Millisecond) // the batch's earlier outputs are acknowledged by now
				return []*kgo.Record{{Topic: out, Key: r.Key, Value: make([]byte, 256<<10)}}, nil
			}
			opts := []eos.Option{eos.Brokers(k.Brokers...), eos.Group(group), eos.InputTopics(in), eos.WithSemantics(sem),
				eos.OnHandlerError(eos.DeadLetter(dlt)),
				eos.ClientOptions(kgo.MaxBufferedBytes(64<<10), kgo.WithHooks(slowFailedPromises{2 * time.Second}))}
			if sem == eos.ExactlyOnce {
				opts = append(opts, processorOpts(k, group, in, "0")[3])
			}
			progress := followCommitted(t, k, out)
			p := startProcessor(t, handler, opts...)
			good := append(append([]string(nil), inputs[:poison]...), inputs[poison+1:]...)
			waitFor(t, 2*time.Minute, "every other input to be copied", func() bool { return progress.n.Load() >= int64(len(good)) })
			time.Sleep(3 * time.Second) // the dead letter, if any, after the late promise
			if err := p.stop(t); err != nil {
				t.Fatalf("processor stopped with %v", err)
			}
			var rep integration.Report
			if sem == eos.ExactlyOnce {
				rep = k.VerifyTopic(good, out, verifyTimeout)
			} else if rep = k.CheckTopic(good, out, verifyTimeout); rep.Lost.Count > 0 || rep.Unexpected.Count > 0 {
				t.Fatalf("at-least-once lost outputs: %v", rep)
			}
			dead := k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout)
			if len(dead) != 1 || string(dead[0].Key) != inputs[poison] {
				keys := make([]string, len(dead))
				for i, r := range dead {
					keys[i] = string(r.Key)
				}
				t.Fatalf("dead-letter topic holds %q; want exactly %s, whose output could not be written (else it was lost)", keys, inputs[poison])
			}
			t.Logf("verifier: %v; dead letter: %s", rep, dead[0].Key)
		})
	}
}

// The same for Transact: a record franz-go fails before buffering, whose
// promise comes after Flush returned, must abort the transaction. Before,
// Transact committed without it and returned nil.
func TestTransactNeverCommitsBeforeEveryRecordIsSettled(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	topic := k.NewTopic(1)
	p, err := eos.NewTransactionalProducer(eos.Brokers(k.Brokers...), eos.TransactionalID(integration.UniqueName(t, "txn")),
		eos.ClientOptions(kgo.MaxBufferedBytes(64<<10), kgo.WithHooks(slowFailedPromises{2 * time.Second})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	err = p.Transact(context.Background(), func(tx *eos.Tx) error {
		// Acknowledged first, so that Flush has nothing to wait for.
		if err := tx.ProduceSync(&kgo.Record{Topic: topic, Value: []byte("small")}); err != nil {
			return err
		}
		tx.Produce(&kgo.Record{Topic: topic, Value: make([]byte, 256<<10)})
		return nil
	})
	if !errors.Is(err, eos.ErrAborted) || !errors.Is(err, kerr.MessageTooLarge) {
		t.Fatalf("Transact returned %v; want ErrAborted wrapping MESSAGE_TOO_LARGE", err)
	}
	if got := k.ReadAll(topic, kgo.ReadCommitted(), verifyTimeout); len(got) != 0 {
		t.Fatalf("%d records visible from the aborted transaction", len(got))
	}
	t.Logf("Transact: %v", err)
}
