package chaos_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/internal/txnscan"
	"github.com/eoskit/eoskit/testsupport/testbed"
	"github.com/eoskit/eoskit/verify"
)

// markerDropLine is what Kafka 4.1-4.4 logs when it drops a transaction's
// marker for a partition that is leaderless at that moment (KAFKA-20734).
const markerDropLine = "Couldn't find leader endpoint for partitions"

// TestReproduceKafka20734 reproduces a broker bug, not an eoskit one, for
// make repro-kafka-20734 (docs/KAFKA-20734.md): on a single Apache Kafka
// node (4.4.0 unless EOSKIT_KAFKA_VERSION says otherwise), three plain
// franz-go transactional copiers (tools/copier -path raw: no eoskit
// code) copy 100,000 records while the broker is restarted four times
// (clean, SIGKILL, clean, SIGKILL, at 20/40/60/80% progress). Each restart
// leaves every partition leaderless for a moment; a transaction ending
// then has its markers dropped with "Couldn't find leader endpoint ...
// likely deleted already", and the producer's next transaction joins the
// open one, so that one marker decides both. It reports, per run, the
// lines the broker logged, the transactions left hanging (find-hanging),
// and what a read_committed reader of the output sees (lost and duplicated
// records). It runs up to EOS_REPRO_RUNS runs (default 3) and passes once a
// run shows the bug: the drop logged and harm done (records lost,
// duplicated or aborted-visible, or a transaction left hanging). It fails
// when no run does: on a broker with the fix (or 4.0.x) that is the
// expected answer.
func TestReproduceKafka20734(t *testing.T) {
	if os.Getenv("EOS_REPRO_KAFKA_20734") != "1" {
		t.Skip("a reproduction of a broker bug, not a test of eoskit: run make repro-kafka-20734")
	}
	runs := 3
	if v := os.Getenv("EOS_REPRO_RUNS"); v != "" {
		var err error
		if runs, err = strconv.Atoi(v); err != nil || runs < 1 {
			t.Fatalf("EOS_REPRO_RUNS=%q: want a positive count", v)
		}
	}
	version := os.Getenv("EOSKIT_KAFKA_VERSION")
	if version == "" {
		version = "4.4.0"
	}
	bin := buildCopier(t)
	var rows []string
	reproduced := false
	for i := 1; i <= runs && !reproduced; i++ {
		var res reproResult
		t.Run(fmt.Sprintf("run-%d", i), func(t *testing.T) { res = reproduceOnce(t, bin, 100_000) })
		rows = append(rows, fmt.Sprintf("| %d | %s | %d | %d | %s | %s | %s |", i, version, len(res.drops), len(res.hangs), res.report.String(), res.stalled, res.took.Round(time.Second)))
		for _, l := range res.drops {
			t.Logf("run %d, broker log: %s", i, l)
		}
		for _, h := range res.hangs {
			t.Logf("run %d, left hanging: %s[%d] producer id %d epoch %d since offset %d (transactional id %s, coordinator %s at epoch %d)",
				i, h.Topic, h.Partition, h.ProducerID, h.ProducerEpoch, h.CurrentTxnStartOffset, h.TransactionalID, h.Coordinator.State, h.Coordinator.ProducerEpoch)
		}
		reproduced = len(res.drops) > 0 && (!res.report.OK() || len(res.hangs) > 0)
	}
	t.Log("\n| run | Apache Kafka | marker drops logged | transactions left hanging | read_committed output (verifier) | copy | time |\n" +
		"| ---: | --- | ---: | ---: | --- | --- | ---: |\n" + strings.Join(rows, "\n"))
	if !reproduced {
		t.Fatalf("KAFKA-20734 not reproduced in %d run(s) on Apache Kafka %s: no run both logged a marker drop and did harm", len(rows), version)
	}
	t.Logf("KAFKA-20734 reproduced on Apache Kafka %s: markers dropped, and the plain franz-go copiers' output harmed", version)
}

type reproResult struct {
	drops   []string // the broker's marker-drop lines
	hangs   []txnscan.Hang
	report  verify.Report // of what a read_committed reader sees
	stalled string        // "complete", or where the copy stopped
	took    time.Duration
}

func reproduceOnce(t *testing.T, bin string, n int) reproResult {
	start := time.Now()
	b := testbed.StartLocalBroker(t)
	k := b.KafkaCluster
	in, out := k.NewTopic(4), k.NewTopic(4)
	group := integration.UniqueName(t, "g")
	inputs := k.Seed(in, n)
	positions := committedPositions(t, k, in)
	adm := kadm.NewClient(k.Client())
	r := &runCtx{t: t, bin: bin, broker: b, in: in, adm: adm, group: group,
		args: []string{"-path", "raw", "-brokers", strings.Join(k.Brokers, ","), "-group", group, "-in", in, "-out", out, "-session-timeout", sessionTimeout.String()}}
	r.copiers = []*copier{r.start("0"), r.start("1"), r.start("2")}
	t.Cleanup(func() {
		for _, c := range r.copiers {
			c.signal(syscall.SIGKILL)
			<-c.done
		}
	})
	progress := func() int64 { return committedInputs(adm, group, in, positions) }
	// reach waits up to 3 minutes for the copy to reach at; a hanging
	// transaction in the group's offsets partition stops it for good, and
	// that is a finding, not a failure.
	stalled := "complete"
	reach := func(at int64) bool {
		deadline := time.Now().Add(3 * time.Minute)
		for progress() < at {
			if time.Now().After(deadline) {
				stalled = fmt.Sprintf("stalled at %d of %d", progress(), n)
				return false
			}
			time.Sleep(100 * time.Millisecond)
		}
		return true
	}
	for i, at := range []float64{0.2, 0.4, 0.6, 0.8} {
		if !reach(int64(at * float64(n))) {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		hard := i%2 == 1
		if err := b.Restart(ctx, hard); err != nil {
			cancel()
			t.Fatalf("restart the broker (hard: %v): %v", hard, err)
		}
		cancel()
	}
	if stalled == "complete" {
		reach(int64(n))
	}
	r.terminate()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := reproResult{stalled: stalled, drops: grepLog(t, b.Log(), markerDropLine)}
	listed, err := adm.ListTopicsWithInternal(ctx, in, out, txnscan.OffsetsTopic)
	if err == nil {
		err = listed.Error()
	}
	if err != nil {
		t.Fatalf("list topics: %v", err)
	}
	// Counted, not closed: no outcome needed.
	if res.hangs, err = txnscan.Find(ctx, adm, listed.TopicsSet(), txnscan.FindOptions{}); err != nil {
		t.Fatalf("find hanging transactions: %v", err)
	}
	// What a read_committed reader sees now: up to each partition's last
	// stable offset, which a hanging transaction holds back.
	outs, err := verify.DecodeOutputs(k.ReadNow(out, kgo.ReadCommitted(), 2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	res.report = verify.Check(verify.Run{Input: inputs, Output: outs})
	res.took = time.Since(start)
	t.Logf("%d marker drops logged, %d transactions left hanging, verifier: %v, copy %s, %s", len(res.drops), len(res.hangs), res.report, stalled, res.took.Round(time.Second))
	return res
}

// grepLog returns the lines of the broker log file that contain s.
func grepLog(t *testing.T, path, s string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("broker log: %v", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			lines = append(lines, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("broker log: %v", err)
	}
	return lines
}
