package eos_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/state/pebblestore"
	"github.com/eoskit/eoskit/verify"
)

// TestMain doubles as the entry point of the copier processes that the crash
// tests SIGKILL: a real process killed mid-transaction is the fault, not a
// simulation of one.
func TestMain(m *testing.M) {
	if os.Getenv("EOS_TEST_COPIER") == "1" {
		os.Exit(copierMain())
	}
	os.Exit(m.Run())
}

// containersSuite skips t outside the containers suite
// (scripts/containers.sh, which picks the tests it runs: eos's one, the
// broker containers bounced, only with --full, as make containers runs
// it): t starts broker containers
// whatever KAFKA_BROKERS names, and the main suite runs with no Docker
// engine.
func containersSuite(t *testing.T) {
	t.Helper()
	if os.Getenv("EOSKIT_CONTAINERS") != "1" {
		t.Skip("runs in make containers (scripts/containers.sh --full)")
	}
}

// chaosSuite skips a test that make chaos runs (EOS_CHAOS=full): a long
// fault test, of which elsewhere says what runs instead.
func chaosSuite(t *testing.T, elsewhere string) {
	t.Helper()
	if os.Getenv("EOS_CHAOS") != "full" {
		t.Skip("runs in make chaos (EOS_CHAOS=full); " + elsewhere)
	}
}

// testClientOpts keep group membership changes fast: a killed member is
// noticed after the session timeout, not the 45 s default.
func testClientOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(6 * time.Second),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.TransactionTimeout(30 * time.Second),
	}
}

func copyHandler(out string) eos.HandlerFunc {
	return func(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		return []*kgo.Record{{Topic: out, Key: in.Key, Value: verify.CopyValue(in)}}, nil
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("EOS_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
}

// running is a processor started by a test.
type running struct {
	p        *eos.Processor
	cancel   context.CancelFunc
	finished chan struct{} // closed when Run returned
	err      error         // what Run returned, once finished is closed
}

// wait returns what Run returned, failing the test if it does not return
// within timeout.
func (r *running) wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case <-r.finished:
		return r.err
	case <-time.After(timeout):
		t.Fatalf("processor did not return within %s", timeout)
		return nil
	}
}

// stop cancels the processor and returns what Run returned.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	return r.wait(t, 60*time.Second)
}

func startProcessor(t testing.TB, h eos.HandlerFunc, opts ...eos.ProcessorOption) *running {
	t.Helper()
	opts = append([]eos.ProcessorOption{eos.Logger(testLogger(t)), eos.ClientOptions(testClientOpts()...)}, opts...)
	p, err := eos.NewProcessor(h, opts...)
	if err != nil {
		t.Fatalf("NewProcessor: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{p: p, cancel: cancel, finished: make(chan struct{})}
	go func() {
		defer close(r.finished)
		r.err = p.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.finished:
		case <-time.After(60 * time.Second):
		}
	})
	return r
}

// counter follows a topic with a read_committed consumer, so that a test can
// wait for progress without re-reading the topic.
type counter struct {
	n atomic.Int64
}

func followCommitted(t testing.TB, k *integration.KafkaCluster, topic string) *counter {
	t.Helper()
	c := &counter{}
	cl := k.Client(
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			f := cl.PollFetches(ctx)
			c.n.Add(int64(f.NumRecords()))
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// waitFor polls cond every 100 ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	waitForWhat(t, timeout, func() string { return what }, cond)
}

// waitForWhat is waitFor for a wait whose message tells what cond saw
// last: what is called once the wait timed out.
func waitForWhat(t testing.TB, timeout time.Duration, what func() string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// endOffsets sums a topic's high watermarks and last stable offsets, of
// the partitions given (none: all).
func endOffsets(t testing.TB, adm *kadm.Client, topic string, partitions ...int32) (hwm, lso int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = h.Error()
	}
	if err != nil {
		t.Fatalf("list end offsets: %v", err)
	}
	l, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = l.Error()
	}
	if err != nil {
		t.Fatalf("list committed offsets: %v", err)
	}
	counted := func(p int32) bool { return len(partitions) == 0 || slices.Contains(partitions, p) }
	h.Each(func(o kadm.ListedOffset) {
		if counted(o.Partition) {
			hwm += o.Offset
		}
	})
	l.Each(func(o kadm.ListedOffset) {
		if counted(o.Partition) {
			lso += o.Offset
		}
	})
	return hwm, lso
}

// groupCommitted sums the offsets group has committed on topic.
func groupCommitted(t testing.TB, adm *kadm.Client, group, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatalf("fetch offsets: %v", err)
	}
	var sum int64
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Topic == topic && o.Err == nil {
			sum += o.At
		}
	})
	return sum
}

// copier is a copy processor in a child process of the test binary (with
// EOS_COPIER_CHANGELOG=topic in env, a counter: eos.Count (with
// EOS_COPIER_WINDOW=finals, eos.WindowedCount of copierWindow emitting
// its finals there; with EOS_COPIER_SESSIONS=finals, eos.SessionCount of
// copierSessions; with EOS_COPIER_PEBBLE=dir, its stores on disk there; with EOS_COPIER_TTL=duration, under eos.TTL;
// with EOS_COPIER_JOIN=table and EOS_COPIER_DEAD=topic, joinCasesTo(out) of
// that table, dead-lettering there; with EOS_COPIER_STANDBYS=n, keeping n
// standbys, advertising copierEndpoint) with that changelog, its updates
// to out; with EOS_COPIER_TXN_TIMEOUT=duration, its transaction timeout).
type copier struct {
	cmd *exec.Cmd
}

func startCopier(t testing.TB, k *integration.KafkaCluster, semantics eos.Semantics, in, out, group, txnID string, env ...string) *copier {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env...),
		"EOS_TEST_COPIER=1",
		"EOS_COPIER_BROKERS="+strings.Join(k.Brokers, ","),
		"EOS_COPIER_SEMANTICS="+semantics.String(),
		"EOS_COPIER_IN="+in,
		"EOS_COPIER_OUT="+out,
		"EOS_COPIER_GROUP="+group,
		"EOS_COPIER_TXN_ID="+txnID,
	)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	integration.ChildProcess(t, cmd)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start copier: %v", err)
	}
	c := &copier{cmd: cmd}
	t.Cleanup(func() { c.kill() })
	return c
}

// kill SIGKILLs the copier, as a crash or an OOM kill would, and reaps it.
func (c *copier) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Wait()
}

// signal sends the copier sig (SIGSTOP, SIGCONT, SIGTERM).
func (c *copier) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to the copier: %v", sig, err)
	}
}

// wait waits up to d for the copier to exit, failing the test when it
// did not, and returns how it exited (nil: 0).
func (c *copier) wait(t testing.TB, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("the copier did not exit within %v", d)
		return nil
	}
}

// holdChangelog sleeps on the first update record buffered in a second:
// a transaction's changelog records are produced first (see
// eos.EmitUpdates), and are sent meanwhile, to sit in the open
// transaction. (The hook runs under the lock of the record's partition:
// holding a changelog record would keep its own partition from being
// sent.)
type holdChangelog struct {
	updates string
	last    time.Time // touched by one producing goroutine at a time
}

func (h *holdChangelog) OnProduceRecordBuffered(r *kgo.Record) {
	if r.Topic == h.updates && time.Since(h.last) > time.Second {
		h.last = time.Now()
		time.Sleep(500 * time.Millisecond)
	}
}

// copierEndpoint is the endpoint a copier with EOS_COPIER_STANDBYS
// advertises (it serves nothing: the standbys' placement reads it).
func copierEndpoint(txnID string) string { return "http://" + txnID + ".copier.example:8080" }

// copierMain runs one copy processor with long transactions (so that a kill
// lands inside one) until it is killed.
func copierMain() int {
	sem := map[string]eos.Semantics{"exactly-once": eos.ExactlyOnce, "at-least-once": eos.AtLeastOnce}[os.Getenv("EOS_COPIER_SEMANTICS")]
	opts := []eos.ProcessorOption{
		eos.Brokers(strings.Split(os.Getenv("EOS_COPIER_BROKERS"), ",")...),
		eos.Group(os.Getenv("EOS_COPIER_GROUP")),
		eos.Topics(os.Getenv("EOS_COPIER_IN")),
		eos.WithSemantics(sem),
		eos.CommitInterval(2 * time.Second),
		eos.MaxRecordsPerCommit(1_000_000),
		eos.ClientOptions(testClientOpts()...),
	}
	if d, err := time.ParseDuration(os.Getenv("EOS_COPIER_TXN_TIMEOUT")); err == nil {
		opts = append(opts, eos.ClientOptions(kgo.TransactionTimeout(d)))
	}
	if id := os.Getenv("EOS_COPIER_TXN_ID"); id != "" {
		opts = append(opts, eos.TransactionalID(id))
	}
	out := os.Getenv("EOS_COPIER_OUT")
	handle := copyHandler(out)
	if cl := os.Getenv("EOS_COPIER_CHANGELOG"); cl != "" {
		// Counts by key instead, its updates to out; and holds each
		// transaction half a second once its first changelog records
		// are produced, so that a kill lands there.
		handle = eos.Count()
		if finals := os.Getenv("EOS_COPIER_SESSIONS"); finals != "" {
			h, err := eos.SessionCount(copierSessions, eos.EmitFinal(finals))
			if err != nil {
				fmt.Fprintln(os.Stderr, "copier:", err)
				return 2
			}
			handle = h
		}
		if finals := os.Getenv("EOS_COPIER_WINDOW"); finals != "" {
			h, err := eos.WindowedCount(copierWindow, eos.EmitFinal(finals))
			if err != nil {
				fmt.Fprintln(os.Stderr, "copier:", err)
				return 2
			}
			handle = h
		}
		stateOpts := []eos.StateOption{eos.EmitUpdates(out)}
		if topic := os.Getenv("EOS_COPIER_JOIN"); topic != "" {
			// Joins the cases with the table of topic instead, the
			// joins to out.
			table := eos.NewTable(topic)
			handle = eos.JoinTable(table, joinCasesTo(out))
			stateOpts = nil
			opts = append(opts, eos.WithTables(table), eos.OnHandlerError(eos.DeadLetter(os.Getenv("EOS_COPIER_DEAD"))))
		}
		if dir := os.Getenv("EOS_COPIER_PEBBLE"); dir != "" {
			stateOpts = append(stateOpts, eos.Stores(pebblestore.Factory(dir, nil)))
		}
		if n := os.Getenv("EOS_COPIER_STANDBYS"); n != "" {
			standbys, _ := strconv.Atoi(n)
			stateOpts = append(stateOpts, eos.Standbys(standbys))
			opts = append(opts, eos.Endpoint(copierEndpoint(os.Getenv("EOS_COPIER_TXN_ID"))))
		}
		if ttl := os.Getenv("EOS_COPIER_TTL"); ttl != "" {
			d, err := time.ParseDuration(ttl)
			if err != nil {
				fmt.Fprintln(os.Stderr, "copier:", err)
				return 2
			}
			stateOpts = append(stateOpts, eos.TTL(d))
		}
		opts = append(opts, eos.Changelog(cl, stateOpts...), eos.ClientOptions(kgo.WithHooks(&holdChangelog{updates: out})))
	}
	slow := func(ctx context.Context, in *kgo.Record) ([]*kgo.Record, error) {
		time.Sleep(200 * time.Microsecond) // keeps the run long enough to kill it mid-way
		return handle(ctx, in)
	}
	p, err := eos.NewProcessor(slow, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "copier:", err)
		return 2
	}
	// A SIGTERM stops it as a rolling deploy does: Run drains and leaves.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := p.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "copier:", err)
		return 1
	}
	return 0
}
