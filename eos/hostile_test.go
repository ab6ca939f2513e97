package eos_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/verify"
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
			opts := []eos.ProcessorOption{eos.Brokers(k.Brokers...), eos.Group(group), eos.Topics(in), eos.WithSemantics(sem),
				eos.OnHandlerError(eos.DeadLetter(dlt)),
				eos.ClientOptions(kgo.MaxBufferedBytes(64<<10), kgo.WithHooks(slowFailedPromises{2 * time.Second}))}
			if sem == eos.ExactlyOnce {
				txnID, err := eos.StableTransactionalID(group, "0")
				if err != nil {
					t.Fatal(err)
				}
				opts = append(opts, eos.TransactionalID(txnID))
			}
			progress := followCommitted(t, k, out)
			p := startProcessor(t, handler, opts...)
			good := append(append([]string(nil), inputs[:poison]...), inputs[poison+1:]...)
			waitFor(t, 2*time.Minute, "every other input to be copied", func() bool { return progress.n.Load() >= int64(len(good)) })
			// The dead letter comes after the late promise; without the
			// fix it never comes, and the wait fails.
			waitFor(t, time.Minute, "the input's dead letter", func() bool {
				return len(k.ReadNow(dlt, kgo.ReadCommitted(), 10*time.Second)) > 0
			})
			if err := p.stop(t); err != nil {
				t.Fatalf("processor stopped with %v", err)
			}
			var rep verify.Report
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

// The output topic does not exist: every output fails with
// UNKNOWN_TOPIC_OR_PARTITION, which is no input's fault. Under DeadLetter
// no input may be dead-lettered for it: the processor restarts its session
// with backoff, and once the topic exists it copies every input exactly
// once. Before, the first failed output's input went to the dead-letter
// topic unprocessed.
func TestMissingOutputTopicBlamesNoInput(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, dlt := k.NewTopic(2), k.NewTopic(1)
	out := integration.UniqueName(t, "missing")
	group := integration.UniqueName(t, "g")
	const n = 200
	inputs := k.SeedHostile(in, n, 50)
	p := startProcessor(t, copyHandler(out), append(processorOpts(k, group, in, "0"),
		eos.OnHandlerError(eos.DeadLetter(dlt)), eos.ClientOptions(kgo.UnknownTopicRetries(1)))...)
	waitFor(t, time.Minute, "a session to fail on the missing output topic", func() bool {
		return strings.Contains(p.p.Health().LastError, kerr.UnknownTopicOrPartition.Message) || strings.Contains(p.p.Health().LastError, "UNKNOWN_TOPIC_OR_PARTITION")
	})
	if dead := k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout); len(dead) != 0 {
		t.Fatalf("%d inputs dead-lettered for a missing output topic (first: %s); no input was at fault", len(dead), dead[0].Key)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if resp, err := k.Admin.CreateTopic(ctx, 2, 1, nil, out); err != nil || resp.Err != nil {
		t.Fatalf("create %s: %v %v", out, err, resp.Err)
	}
	progress := followCommitted(t, k, out)
	waitFor(t, 2*time.Minute, "every input to be copied once the topic exists", func() bool { return progress.n.Load() >= int64(len(inputs.Committed)) })
	if err := p.stop(t); err != nil {
		t.Fatalf("processor stopped with %v", err)
	}
	rep := k.VerifyInputs(inputs, out, verifyTimeout)
	if dead := k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout); len(dead) != 0 {
		t.Fatalf("%d inputs dead-lettered; none was at fault", len(dead))
	}
	t.Logf("verifier: %v; nothing dead-lettered", rep)
}

// The dead-letter topic does not exist. That is a configuration error,
// not a record's: Run must return a *eoskit.ConfigError naming the option and the
// topic within seconds, before it consumes anything, with franz-go's
// default retries (each failed dead letter used to wait out its metadata
// retries: four attempts, 77 s measured, then a *DeadLetterError). A
// processor started once the topic exists dead-letters the failing record
// and copies the rest, nothing lost.
func TestMissingDeadLetterTopicIsAConfigErrorWithinSeconds(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(1), k.NewTopic(1)
	dlt := integration.UniqueName(t, "missing-dlt")
	group := integration.UniqueName(t, "g")
	inputs := k.SeedHostile(in, 100, 25)
	const poison = "in-50"
	fails := func(r *kgo.Record) bool { return string(r.Key) == poison }
	opts := append(processorOpts(k, group, in, "0"), eos.OnHandlerError(eoskit.Retry(10*time.Millisecond, 2).Then(eos.DeadLetter(dlt))))
	start := time.Now()
	p := startProcessor(t, failingOn(out, fails), opts...)
	err := p.wait(t, 2*time.Minute)
	var ce *eoskit.ConfigError
	if took := time.Since(start); !errors.As(err, &ce) || !errors.Is(err, eoskit.ErrInvalidConfig) || ce.Setting != "OnHandlerError" ||
		!strings.Contains(ce.Reason, dlt) || took > 15*time.Second {
		t.Fatalf("Run returned %v after %s; want a *ConfigError naming OnHandlerError and %s within 15 s", err, took.Round(time.Millisecond), dlt)
	}
	if got := len(k.ReadNow(out, kgo.ReadUncommitted(), 5*time.Second)); got != 0 {
		t.Fatalf("%d records written before the configuration error; want none", got)
	}
	t.Logf("Run: %v", err)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if resp, err := k.Admin.CreateTopic(ctx, 1, 1, nil, dlt); err != nil || resp.Err != nil {
		t.Fatalf("create %s: %v %v", dlt, err, resp.Err)
	}
	progress := followCommitted(t, k, out)
	fixed := startProcessor(t, failingOn(out, fails), opts...)
	good := slices.DeleteFunc(slices.Clone(inputs.Committed), func(id string) bool { return id == poison })
	waitFor(t, 2*time.Minute, "the rest to be copied", func() bool { return progress.n.Load() >= int64(len(good)) })
	time.Sleep(time.Second)
	if err := fixed.stop(t); err != nil {
		t.Fatalf("processor stopped with %v", err)
	}
	k.VerifyInputs(integration.Inputs{Committed: good, Aborted: inputs.Aborted}, out, verifyTimeout)
	if dead := k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout); len(dead) != 1 || string(dead[0].Key) != poison {
		t.Fatalf("dead-letter topic holds %d records; want exactly %s", len(dead), poison)
	}
}

// One handler call outlives the transaction timeout (5 s here): the
// coordinator aborts the transaction under the processor and bumps the
// epoch, and the processor's next request fails with an epoch error. That
// is not another instance taking the transactional id: the processor must
// start a new session and go on, every input copied once, with the abort
// counted as a timeout, not a fencing. Before, Run returned ErrFenced,
// documented as final, and the copy stopped. The handler holds until the
// coordinator shows the transaction aborted (its check for timed-out
// transactions runs every 10 s by default), so the fault is certain.
func TestProcessorOutlivingItsTransactionTimeoutIsNotFenced(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(1), k.NewTopic(1)
	group := integration.UniqueName(t, "g")
	txnID, _ := eos.StableTransactionalID(group, "0")
	inputs := k.SeedHostile(in, 300, 50)
	var stalled atomic.Bool
	timedOut := make(chan error, 1)
	handler := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		if string(r.Key) == "in-100" && stalled.CompareAndSwap(false, true) {
			timedOut <- waitForCoordinatorAbort(k, txnID, 45*time.Second)
		}
		return copyHandler(out)(ctx, r)
	}
	metrics := &countingMetrics{}
	progress := followCommitted(t, k, out)
	p := startProcessor(t, handler, append(processorOpts(k, group, in, "0"), eos.WithMetrics(metrics),
		eos.ClientOptions(kgo.TransactionTimeout(5*time.Second)))...)
	waitFor(t, 2*time.Minute, "every input to be copied, or Run to return", func() bool {
		select {
		case <-p.finished:
			return true
		default:
			return progress.n.Load() >= int64(len(inputs.Committed))
		}
	})
	if err := p.stop(t); err != nil {
		t.Fatalf("Run returned %v after a transaction outlived its timeout; want the processor to go on", err)
	}
	select {
	case err := <-timedOut:
		if err != nil {
			t.Fatalf("the fault never struck: %v", err)
		}
	default:
		t.Fatal("the handler never held a transaction past its timeout")
	}
	// The handler returns past the budget, so the processor ends the
	// transaction itself: mostly its abort fails with the epoch error of
	// the coordinator's abort, counted "timeout"; sometimes the
	// coordinator accepts it and the processor counts its own "budget"
	// (once in a loaded make test, 2026-12-03, every input copied once).
	// Either is right; a fencing is not.
	if reasons := metrics.abortReasons(); !strings.Contains(reasons, "timeout") && !strings.Contains(reasons, "budget") || metrics.fenced.Load() != 0 {
		t.Fatalf("aborts %q, fencings %d: want the transaction's timeout counted (the coordinator's, or the processor's budget), and no fencing", reasons, metrics.fenced.Load())
	}
	t.Logf("aborts: %s; verifier: %v", metrics.abortReasons(), k.VerifyInputs(inputs, out, verifyTimeout))
}

// waitForCoordinatorAbort waits until txnID's coordinator has aborted an
// open transaction of it for its timeout (PrepareAbort or CompleteAbort,
// after having seen it Ongoing), or returns an error at the deadline.
func waitForCoordinatorAbort(k *integration.KafkaCluster, txnID string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ongoing := false
	for last := ""; ; {
		d, err := k.Admin.DescribeTransactions(ctx, txnID)
		if err == nil {
			last = d[txnID].State
			ongoing = ongoing || last == "Ongoing"
			if ongoing && (last == "PrepareAbort" || last == "CompleteAbort") {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the coordinator did not abort %s within %s (last state %q, err %v)", txnID, timeout, last, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// The output topic's max.message.bytes (1,000) is below what franz-go puts
// in one produce batch, though every output alone fits: the broker refuses
// whole batches with MESSAGE_TOO_LARGE, which franz-go hands to every
// record in them. No input is at fault, and none may be dead-lettered: the
// processor reads the batch again settling each input's outputs alone, and
// every input is copied once. Before, the first output of each refused
// batch sent its input to the dead-letter topic unprocessed.
func TestBatchRefusedWholeBlamesNoInput(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, dlt := k.NewTopic(1), k.NewTopic(1)
	out := integration.UniqueName(t, "small")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if resp, err := k.Admin.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": kadmString("1000")}, out); err != nil || resp.Err != nil {
		t.Fatalf("create %s: %v %v", out, err, resp.Err)
	}
	t.Cleanup(func() { _, _ = k.Admin.DeleteTopics(context.Background(), out) })
	group := integration.UniqueName(t, "g")
	// Plain seeding: the records arrive in one poll, so the outputs fill
	// produce batches larger than the topic takes.
	const n = 300
	inputs := k.Seed(in, n)
	progress := followCommitted(t, k, out)
	metrics := &countingMetrics{}
	p := startProcessor(t, copyHandler(out), append(processorOpts(k, group, in, "0"), eos.OnHandlerError(eos.DeadLetter(dlt)), eos.WithMetrics(metrics))...)
	waitFor(t, 2*time.Minute, "every input to be copied", func() bool { return progress.n.Load() >= n })
	if err := p.stop(t); err != nil {
		t.Fatalf("processor stopped with %v", err)
	}
	if !strings.Contains(metrics.abortReasons(), "produce-error") {
		t.Fatalf("no produce batch was refused (aborts: %q): the fault was not injected", metrics.abortReasons())
	}
	rep := k.VerifyTopic(inputs, out, verifyTimeout)
	if dead := k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout); len(dead) != 0 {
		t.Fatalf("%d inputs dead-lettered (first: %s); none was at fault", len(dead), dead[0].Key)
	}
	t.Logf("verifier: %v; nothing dead-lettered", rep)
}

func kadmString(s string) *string { return &s }

// slowCopy copies like copyHandler after d, or returns ctx's error if ctx
// ends first (a handler calling a slow service with ctx).
func slowCopy(out string, d time.Duration) eos.HandlerFunc {
	return func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return copyHandler(out)(ctx, r)
	}
}

// Every record takes 500 ms and a poll brings up to 40 of them: a batch
// that handled its whole poll would stay open for 10 s or more under a 5 s
// transaction timeout, be aborted by the coordinator, and be read again in
// the same shape: nothing would ever commit. The processor must end each
// transaction early, before the coordinator kills it, and handle fewer
// records per transaction until they fit: everything copied exactly once,
// no transaction aborted by the broker, no record blamed. Inputs come from a
// transactional producer that also aborts, over 2 partitions.
func TestSlowHandlersEndTheirTransactionBeforeTheBrokerAbortsIt(t *testing.T) {
	t.Parallel()
	k := integration.Kafka(t)
	in, out := k.NewTopic(2), k.NewTopic(2)
	group := integration.UniqueName(t, "g")
	inputs := k.SeedHostile(in, 40, 10)
	metrics := &countingMetrics{}
	progress := followCommitted(t, k, out)
	p := startProcessor(t, slowCopy(out, 500*time.Millisecond), append(processorOpts(k, group, in, "0"),
		eos.WithMetrics(metrics), eos.ClientOptions(kgo.TransactionTimeout(5*time.Second)))...)
	waitFor(t, 2*time.Minute, "every input to be copied, or Run to return", func() bool {
		select {
		case <-p.finished:
			return true
		default:
			return progress.n.Load() >= int64(len(inputs.Committed))
		}
	})
	if err := p.stop(t); err != nil {
		t.Fatalf("Run returned %v; slow handlers are no record's fault", err)
	}
	reasons := metrics.abortReasons()
	if strings.Contains(reasons, "timeout") || strings.Contains(reasons, "handler-error") {
		t.Fatalf("transactions aborted for %q: the broker killed one, or a record was blamed", reasons)
	}
	if !strings.Contains(reasons, "budget") {
		t.Fatalf("no transaction ran out of its budget (aborts: %q): the fault was not injected", reasons)
	}
	rep := k.VerifyInputs(inputs, out, verifyTimeout)
	t.Logf("verifier: %v; %d transactions committed; aborts: %s", rep, metrics.committed.Load(), metrics.abortReasons())
}

// One record's handler never finishes on its own (it waits for its ctx, as
// a call to a hung service does): alone in its transaction it is slower
// than any transaction may last, which is that record's fault. Under Stop,
// Run returns a *eoskit.RecordError naming it and wrapping ErrHandlerTooSlow, the
// records before it are copied once and the ones after it are not lost
// (their offsets are not committed). Under DeadLetter it goes to the
// dead-letter topic and everything else is copied once. Before, the
// coordinator aborted the transaction, the session restarted, and the same
// record stalled it again, forever.
func TestHandlerSlowerThanATransactionIsBlamed(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"stop", "dead-letter", "dead-letter, lanes"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			k := integration.Kafka(t)
			partitions, records := int32(1), 30
			if policy == "dead-letter, lanes" {
				// Handlers at once, a lane per partition: the other
				// lanes' records finish while the slow one holds its
				// transaction, and the budget's rule still finds it.
				partitions, records = 4, 200
			}
			in, out, dlt := k.NewTopic(partitions), k.NewTopic(1), k.NewTopic(1)
			group := integration.UniqueName(t, "g")
			inputs := k.SeedHostile(in, records, 10)
			const hung = "in-10"
			var hungAt atomic.Int64
			handler := func(ctx context.Context, r *kgo.Record) ([]*kgo.Record, error) {
				if string(r.Key) == hung {
					hungAt.Store(r.Offset)
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-time.After(20 * time.Second): // past the 5 s timeout: the broker aborts
					}
				}
				return copyHandler(out)(ctx, r)
			}
			opts := append(processorOpts(k, group, in, "0"), eos.ClientOptions(kgo.TransactionTimeout(5*time.Second)))
			switch policy {
			case "dead-letter":
				opts = append(opts, eos.OnHandlerError(eos.DeadLetter(dlt)))
			case "dead-letter, lanes":
				opts = append(opts, eos.OnHandlerError(eos.DeadLetter(dlt)), eos.Concurrency(4, eos.PartitionOrder))
			}
			progress := followCommitted(t, k, out)
			p := startProcessor(t, handler, opts...)
			good := slices.DeleteFunc(slices.Clone(inputs.Committed), func(id string) bool { return id == hung })
			if policy == "stop" {
				err := p.wait(t, 2*time.Minute)
				var he *eoskit.RecordError
				// Not context.DeadlineExceeded: callers take that for their
				// own ctx ending.
				if !errors.As(err, &he) || !errors.Is(err, eos.ErrHandlerTooSlow) || he.Offset != hungAt.Load() || errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Run returned %v; want a *RecordError for %s wrapping ErrHandlerTooSlow", err, hung)
				}
				rep := k.VerifyInputs(integration.Inputs{Committed: inputs.Committed[:10], Aborted: inputs.Aborted}, out, verifyTimeout)
				// Offsets between the record before it and it hold
				// markers and aborted records: any of them will do.
				if at := groupCommitted(t, k.Admin, group, in); at > hungAt.Load() {
					t.Fatalf("the group's offset is %d, past the blamed record's (%d): it would never be read again", at, hungAt.Load())
				}
				t.Logf("Run: %v; verifier over the records before it: %v", err, rep)
				return
			}
			waitFor(t, 2*time.Minute, "every other input to be copied, or Run to return", func() bool {
				select {
				case <-p.finished:
					return true
				default:
					return progress.n.Load() >= int64(len(good))
				}
			})
			if err := p.stop(t); err != nil {
				t.Fatalf("Run returned %v", err)
			}
			rep := k.VerifyInputs(integration.Inputs{Committed: good, Aborted: inputs.Aborted}, out, verifyTimeout)
			dead := k.ReadAll(dlt, kgo.ReadCommitted(), verifyTimeout)
			if len(dead) != 1 || string(dead[0].Key) != hung {
				t.Fatalf("dead-letter topic holds %d records; want exactly %s", len(dead), hung)
			}
			var why string
			for _, h := range dead[0].Headers {
				if h.Key == "eoskit-error" {
					why = string(h.Value)
				}
			}
			if !strings.Contains(why, eos.ErrHandlerTooSlow.Error()) {
				t.Fatalf("the dead letter says %q; want it to say the handler was too slow", why)
			}
			t.Logf("verifier: %v; dead letter: %s", rep, dead[0].Key)
		})
	}
}
