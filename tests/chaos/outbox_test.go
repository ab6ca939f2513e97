package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/testsupport/testbed"
	"github.com/eoskit/eoskit/verify"
)

// outboxScenario is one fault of the outbox path, injected at 20, 45 and
// 70% of the relay's progress.
type outboxScenario struct {
	name    string
	cluster bool // on a three-node cluster (RF=3, min.insync.replicas=2)
	full    bool // only in the full matrix (make chaos)
	// writing is how long the writers take to write the records (0: as
	// fast as they can): at least the three faults' own length, so that
	// each ends with records left to publish.
	writing time.Duration
	inject  func(ctx context.Context, r *outboxRun) error
}

var outboxScenarios = []outboxScenario{
	{name: "sigkill-relay", inject: func(ctx context.Context, r *outboxRun) error {
		active, err := r.active(ctx)
		if err != nil {
			return err
		}
		active.signal(syscall.SIGKILL)
		<-active.done
		r.relays = append(r.relays, r.start()) // the next standby
		return nil
	}},
	{name: "sigstop-relay", writing: time.Minute, inject: func(ctx context.Context, r *outboxRun) error {
		// The active relay stalls past its transaction timeout; the
		// standby sees it silent, ends its session on the slot, fences
		// it in Kafka and takes over. Woken, the zombie is either
		// fenced (it had a transaction open: exit 3) or, its slot
		// session gone, stands by; it must not hold the slot again.
		active, err := r.active(ctx)
		if err != nil {
			return err
		}
		active.signal(syscall.SIGSTOP)
		time.Sleep(12 * time.Second)
		holder, err := r.active(ctx)
		if err != nil {
			return err
		}
		r.relays = append(r.relays, holder) // active took it out
		active.signal(syscall.SIGCONT)
		select {
		case <-active.done:
			if active.exit != 3 {
				return fmt.Errorf("the woken relay %s exited %d; want 3 (fenced)", active.name, active.exit)
			}
			r.relays = append(r.relays, r.start()) // the next standby
		case <-time.After(5 * time.Second):
			r.relays = append(r.relays, active) // standing by
		}
		return nil
	}},
	{name: "postgres-restart", full: true, inject: func(ctx context.Context, r *outboxRun) error {
		return r.pg.Restart(ctx, true)
	}},
	{name: "cluster-kill-leader", cluster: true, full: true, writing: 150 * time.Second, inject: func(ctx context.Context, r *outboxRun) error {
		md, err := r.adm.Metadata(ctx, r.out)
		if err != nil {
			return err
		}
		return r.cluster.Restart(ctx, int(md.Topics[r.out].Partitions[0].Leader), true)
	}},
	{name: "cluster-kill-coordinator", cluster: true, full: true, writing: 150 * time.Second, inject: func(ctx context.Context, r *outboxRun) error {
		c, ok := r.adm.FindTxnCoordinators(ctx, r.txnID)[r.txnID]
		if !ok || c.Err != nil {
			return fmt.Errorf("find the relay's transaction coordinator: %v", c.Err)
		}
		return r.cluster.Restart(ctx, int(c.NodeID), true)
	}},
	{name: "cluster-rolling-restart", cluster: true, full: true, writing: 300 * time.Second, inject: func(ctx context.Context, r *outboxRun) error {
		return r.cluster.RollingRestart(ctx, false)
	}},
}

// TestChaosOutbox is the chaos matrix's outbox path: eight writers commit
// records (shared keys, ids committing out of order, one transaction in
// ten rolled back) to the outbox of a PostgreSQL of the test's own, while
// relay processes (one active, one standing by) publish them and the
// scenario strikes three times. The verifier then checks the output:
// every committed record once, per key in commit order, nothing rolled
// back or aborted visible. make test runs sigkill-relay; make chaos all.
func TestChaosOutbox(t *testing.T) {
	full := os.Getenv("EOS_CHAOS") == "full"
	if os.Getenv("EOS_CHAOS") == "soak" {
		return // the soak is the copiers'
	}
	records := 20_000
	if full {
		records = 100_000
	} else {
		// make test's subset: a broker and a PostgreSQL of its own, beside
		// TestChaos's scenarios (one after another here: the table's order).
		t.Parallel()
	}
	bin := buildCopier(t)
	var rows []string
	for _, sc := range outboxScenarios {
		if sc.full && !full {
			continue
		}
		t.Run("outbox/"+sc.name, func(t *testing.T) {
			row := runOutboxScenario(t, bin, sc, records)
			rows = append(rows, row)
			t.Log("row: " + row) // as soon as it is known (with -v)
		})
	}
	table := "| path | scenario | faults injected | records (committed, rolled back) | relay processes | fenced zombies | verifier | time |\n" +
		"| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |\n" + strings.Join(rows, "\n")
	t.Log("\n" + table)
	if out := os.Getenv("EOS_CHAOS_TABLE"); out != "" {
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, _ = fmt.Fprintf(f, "\n%s\n", table)
			_ = f.Close()
		}
	}
}

type outboxRun struct {
	t         *testing.T
	bin       string
	url       string
	args      []string
	pg        *testbed.PrivatePostgres
	pool      *pgxpool.Pool
	slot      string
	txnID     string
	adm       *kadm.Client
	cluster   *testbed.LocalCluster
	out       string
	relays    []*copier // the live ones
	all       []*copier
	instances int
}

// start starts a relay process, which stands by if another holds the slot.
func (r *outboxRun) start() *copier {
	name := fmt.Sprint(r.instances)
	r.instances++
	// The application name tells which process holds the slot.
	cmd := exec.Command(r.bin, append(append([]string{}, r.args...), "-instance", name,
		"-database-url", r.url+"&application_name=eoskit-relay-"+name)...)
	cmd.Stderr = os.Stderr
	integration.ChildProcess(r.t, cmd)
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start relay: %v", err)
	}
	c := &copier{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		c.exit = cmd.ProcessState.ExitCode()
		close(c.done)
	}()
	r.all = append(r.all, c)
	return c
}

// active returns the relay process holding the slot (its replication
// connection's application name is its instance's).
func (r *outboxRun) active(ctx context.Context) (*copier, error) {
	for ctx.Err() == nil {
		var name *string
		_ = r.pool.QueryRow(ctx, `SELECT a.application_name FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
			WHERE s.slot_name = $1`, r.slot).Scan(&name)
		if name != nil {
			for i, c := range r.relays {
				if "eoskit-relay-"+c.name == *name {
					r.relays = append(r.relays[:i:i], r.relays[i+1:]...)
					return c, nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, fmt.Errorf("no relay process holds slot %s: %w", r.slot, ctx.Err())
}

func runOutboxScenario(t *testing.T, bin string, sc outboxScenario, n int) string {
	start := time.Now()
	var k *integration.KafkaCluster
	var cluster *testbed.LocalCluster
	if sc.cluster {
		cluster = testbed.StartLocalCluster(t)
		k = cluster.KafkaCluster
	} else {
		k = integration.Kafka(t)
	}
	pg := testbed.StartPrivatePostgres(t)
	pool := pg.Pool(t)
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	slot, err := outbox.DefaultSlot(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	out, positions := k.NewTopic(4), k.NewTopic(1)
	load, err := testbed.NewOutboxLoad(ctx, pool, out)
	if err != nil {
		t.Fatal(err)
	}
	r := &outboxRun{t: t, bin: bin, url: pg.URL, pg: pg, pool: pool, slot: slot, txnID: "eoskit-outbox-" + slot,
		adm: kadm.NewClient(k.Client()), cluster: cluster, out: out}
	r.args = []string{"-path", "outbox", "-brokers", strings.Join(k.Brokers, ","), "-in", positions}
	r.relays = []*copier{r.start(), r.start()}
	t.Cleanup(func() {
		for _, c := range r.relays {
			c.signal(syscall.SIGCONT)
			c.signal(syscall.SIGKILL)
			<-c.done
		}
	})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wrote := make(chan error, 1)
	var writing atomic.Bool
	writing.Store(true)
	faulted := make(chan struct{})
	go func() {
		defer writing.Store(false)
		if sc.name != "postgres-restart" {
			wrote <- writePaced(wctx, load, n, sc.writing)
			return
		}
		// Two more writers write until the last restart, so that the
		// restarts cut writers' transactions however fast the n are
		// written.
		until := make(chan error, 1)
		go func() { until <- load.WriteUntil(wctx, faulted, 2, 500) }()
		err := writePaced(wctx, load, n, sc.writing)
		wrote <- errors.Join(err, <-until)
	}()

	stalled := func() string {
		return fmt.Sprintf("output's last stable offsets sum to %d", outboxProgress(r.adm, out))
	}
	faults := 0
	for _, at := range []float64{0.2, 0.45, 0.7} {
		waitFor(t, 3*time.Minute, fmt.Sprintf("%.0f%% progress", at*100), stalled, func() bool { return float64(outboxProgress(r.adm, out)) >= at*float64(n) })
		ictx, icancel := context.WithTimeout(ctx, 3*time.Minute)
		if err := sc.inject(ictx, r); err != nil {
			icancel()
			t.Fatalf("inject %s: %v", sc.name, err)
		}
		icancel()
		// The fault struck mid-work only if records were left to
		// publish after it: the writers were still writing, or the
		// output's last stable offsets (records, markers and aborted
		// records: at least what was published) sum to less than n.
		var published int64
		var perr error
		for range 30 { // the cluster may still be settling after the fault
			if published, perr = outboxProgressErr(r.adm, out); perr == nil {
				break
			}
			time.Sleep(time.Second)
		}
		switch {
		case perr != nil:
			t.Errorf("fault %d (%s): reading the output's progress: %v", faults+1, sc.name, perr)
		case !writing.Load() && published >= int64(n):
			t.Errorf("fault %d (%s) ended with every record written and %d offsets in the output: it struck no work in flight", faults+1, sc.name, published)
		}
		faults++
	}
	close(faulted)
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Minute):
		t.Fatal("the writers did not finish within 5 minutes")
	}
	in, err := load.Inputs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Minute, "every committed record published", stalled, func() bool {
		if outboxProgress(r.adm, out) < int64(len(in.Committed)) {
			return false
		}
		return len(k.ReadNow(out, kgo.ReadCommitted(), time.Minute)) >= len(in.Committed)
	})
	for _, c := range r.relays {
		c.signal(syscall.SIGTERM)
	}
	fenced, failed := 0, 0
	for _, c := range r.all {
		select {
		case <-c.done:
		case <-time.After(time.Minute):
			t.Fatalf("relay %s did not stop within a minute of SIGTERM", c.name)
		}
		switch c.exit {
		case 0, -1: // stopped, or killed by the scenario
		case 3:
			fenced++
		default:
			failed++
		}
	}
	if failed > 0 {
		t.Errorf("%d relay(s) exited with an error: a fault they did not survive (their stderr is above)", failed)
	}
	outs, err := verify.DecodeOutputs(k.ReadAll(out, kgo.ReadCommitted(), 2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	rep := verify.Check(verify.Run{Input: in.Committed, AbortedInput: in.Aborted, Output: outs,
		Aborted: verify.AbortedPositions(k.ReadRaw(out, 2*time.Minute))})
	if err := rep.Err(); err != nil {
		t.Error(err)
	}
	if sc.cluster {
		if open := testbed.OpenTransactions(t, k, out, positions); len(open) > 0 {
			t.Errorf("transactions left open at the end: %v", open)
		}
	}
	if sc.name == "postgres-restart" && load.Failed() == 0 {
		t.Errorf("the restarts cut no writer's transaction, though writers wrote until the last one")
	}
	return fmt.Sprintf("| outbox | %s | %d | %d (+%d) | %d | %d | %s | %s |", sc.name, faults, len(in.Committed), len(in.Aborted),
		len(r.all), fenced, rep.String(), time.Since(start).Round(time.Second))
}

// writePaced writes n records with load's writers, in chunks of 1,000
// spread over about d (0: at once). A node fault takes 20 to 60 s from its
// start to the cluster's recovery, a relay's stall 12 s and its standby's
// takeover: unpaced, 20,000 records were all published before the first
// stall of sigstop-relay ended.
func writePaced(ctx context.Context, load *testbed.OutboxLoad, n int, d time.Duration) error {
	if d == 0 {
		return load.Write(ctx, n, 8, 500)
	}
	pause := d / time.Duration(max(1, n/1000))
	for left := n; left > 0; left -= 1000 {
		if err := load.Write(ctx, min(left, 1000), 8, 500); err != nil {
			return err
		}
		if left <= 1000 {
			return nil // no pause after the last chunk: the writers are done
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
	return nil
}

// outboxProgress sums the output's last stable offsets: records and
// markers the relay committed.
func outboxProgress(adm *kadm.Client, topic string) int64 {
	n, _ := outboxProgressErr(adm, topic)
	return n
}

// outboxProgressErr is outboxProgress, or why it could not be read (a
// request or a partition that failed: a partial sum would read as work
// left).
func outboxProgressErr(adm *kadm.Client, topic string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, err
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n, nil
}
