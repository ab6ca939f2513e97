package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/internal/txnscan"
	"github.com/eoskit/eoskit/testsupport/testbed"
)

// An operator finds the hanging transactions Kafka 4.4 leaves behind after
// broker bounces (here built on a private broker, see
// testbed.LocalBroker.LeaveHangingTransaction: a group's offset commit
// for partition 0 pending in __consumer_offsets with no marker to come, its
// coordinator having committed it, or being Empty at its epoch: for a
// protocol v2 client, one it never registered), and closes each with the
// marker of its outcome, never the other one:
//   - find-hanging lists exactly the hangs there are (exit 3), with the
//     transactional id, and with the outcome the coordinator's state gives
//     only when the operator vouches that the clients speak protocol v2
//     (-clients-speak-v2), unknown otherwise;
//   - close -dry-run, close with an -outcome that contradicts the
//     coordinator, and close of an unknown outcome without -outcome,
//     write nothing: the group's offset stays pending;
//   - close writes the marker, and the group's offset becomes what the
//     transaction's outcome says (500 committed; 0, the offset before, for
//     the other, closed with -outcome abort);
//   - find-hanging then finds nothing (exit 0).
func TestTxnCommandFindsAndClosesHangingTransactionsWithTheirOutcome(t *testing.T) {
	b := testbed.StartLocalBroker(t)
	k := b.KafkaCluster
	cases := []struct {
		name    string
		end     testbed.HangingEnd
		outcome string   // what find-hanging -clients-speak-v2 must say
		refused []string // close arguments it must refuse, writing nothing
		want    string   // why
		closing []string // close arguments that close it
		offset  int64    // the group's offset once closed
	}{
		// The coordinator committed it one epoch later: a v2 client's
		// commit. Aborting contradicts it.
		{"committed", testbed.HangCommitted, "committed", []string{"-clients-speak-v2", "-outcome", "abort"}, "contradicts", []string{"-clients-speak-v2"}, 500},
		// The coordinator is Empty at the transaction's own epoch: a v2
		// client's transaction it never registered (abort). Without
		// -clients-speak-v2 the outcome is unknown and close wants it
		// named.
		{"forgotten", testbed.HangForgotten, "aborted", nil, "is unknown", []string{"-outcome", "abort"}, 0},
	}
	// The hangs are built first, all on one broker, so that find-hanging
	// must tell them apart.
	type built struct {
		group, in, txnID string
	}
	var hangs []built
	for _, c := range cases {
		in, side := k.NewTopic(2), k.NewTopic(1)
		k.Seed(in, 1_000)
		group := integration.UniqueName(t, "g-"+c.name)
		txnID, err := eos.StableTransactionalID(group, "0")
		if err != nil {
			t.Fatal(err)
		}
		testbed.LeaveHangingTransaction(t, b.KafkaCluster, txnID, group, in, side, 500, c.end)
		hangs = append(hangs, built{group, in, txnID})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	brokers := "-brokers=" + strings.Join(k.Brokers, ",")

	// Without the operator vouching for the clients' protocol, no
	// outcome is read from the coordinator: a v1 client's epoch spans
	// many transactions.
	for _, h := range findHanging(ctx, t, brokers) {
		if h.Outcome != "unknown" {
			t.Fatalf("find-hanging without -clients-speak-v2 listed %s[%d] with outcome %s; want unknown", h.Topic, h.Partition, h.Outcome)
		}
	}
	found := findHanging(ctx, t, brokers, "-clients-speak-v2")
	table, _ := runTool(ctx, "txn", "find-hanging", brokers, "-clients-speak-v2")
	t.Logf("find-hanging -clients-speak-v2:\n%s", table)
	if len(found) != len(cases) {
		t.Fatalf("find-hanging listed %d hanging transactions, want %d: %+v", len(found), len(cases), found)
	}
	for i, c := range cases {
		h := hangs[i]
		var hang *txnscan.Hang
		for j := range found {
			if found[j].TransactionalID == h.txnID {
				hang = &found[j]
			}
		}
		if hang == nil {
			t.Fatalf("%s: find-hanging did not list %s's transaction: %+v", c.name, h.txnID, found)
		}
		if hang.Topic != txnscan.OffsetsTopic || hang.Outcome != c.outcome {
			t.Fatalf("%s: find-hanging listed %s[%d] with outcome %s (%s); want %s with outcome %s", c.name, hang.Topic, hang.Partition, hang.Outcome, hang.Evidence, txnscan.OffsetsTopic, c.outcome)
		}
		out, code := runTool(ctx, "txn", "describe", brokers, "-json", "-id", h.txnID, "-topic", txnscan.OffsetsTopic, "-topic", h.in)
		var d description
		if err := json.Unmarshal([]byte(out), &d); code != exitOK || err != nil {
			t.Fatalf("%s: describe exited %d: %s", c.name, code, out)
		}
		if len(d.Open) != 1 || d.Open[0].State != "hanging" || d.Open[0].Topic != txnscan.OffsetsTopic {
			t.Fatalf("%s: describe shows %+v open; want the one hanging in %s", c.name, d.Open, txnscan.OffsetsTopic)
		}
		target := []string{"txn", "close", brokers, "-topic", hang.Topic, "-partition", strconv.Itoa(int(hang.Partition)), "-producer-id", strconv.FormatInt(hang.ProducerID, 10)}

		out, code = runTool(ctx, append(append(target, c.closing...), "-dry-run")...)
		if code != exitOK || !strings.Contains(out, "would write") {
			t.Fatalf("%s: close -dry-run exited %d: %s", c.name, code, out)
		}
		testbed.RequireUnstable(ctx, t, k, h.group, h.in)

		out, code = runTool(ctx, append(target, c.refused...)...)
		if code != exitError || !strings.Contains(out, c.want) {
			t.Fatalf("%s: close %v exited %d, want a refusal (%s): %s", c.name, c.refused, code, c.want, out)
		}
		testbed.RequireUnstable(ctx, t, k, h.group, h.in)

		out, code = runTool(ctx, append(target, c.closing...)...)
		if code != exitOK || !strings.Contains(out, "wrote") {
			t.Fatalf("%s: close exited %d: %s", c.name, code, out)
		}
		t.Logf("%s: %s", c.name, out)
		fetched, err := k.Admin.FetchOffsets(kadm.RequireStable(ctx), h.group)
		if err != nil {
			t.Fatalf("FetchOffsets: %v", err)
		}
		if o, ok := fetched.Lookup(h.in, 0); !ok || o.Err != nil || o.At != c.offset {
			t.Fatalf("%s: the group's offset for %s[0] is %+v once closed; want %d", c.name, h.in, o, c.offset)
		}
	}
	if left := findHanging(ctx, t, brokers, "-clients-speak-v2"); len(left) != 0 {
		t.Fatalf("find-hanging still lists %+v", left)
	}
	// Closing again is refused: nothing hangs there any more.
	out, code := runTool(ctx, "txn", "close", brokers, "-topic", txnscan.OffsetsTopic, "-partition", strconv.Itoa(int(found[0].Partition)), "-producer-id", strconv.FormatInt(found[0].ProducerID, 10))
	if code != exitError || !strings.Contains(out, "holds no hanging transaction") {
		t.Fatalf("closing a closed transaction exited %d: %s", code, out)
	}
}

// findHanging runs find-hanging -json and decodes what it lists; it fails t
// unless the exit status matches the listing.
func findHanging(ctx context.Context, t *testing.T, brokers string, flags ...string) []txnscan.Hang {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(ctx, append([]string{"txn", "find-hanging", brokers, "-json"}, flags...), &stdout, &stderr)
	var hangs []txnscan.Hang
	if err := json.Unmarshal(stdout.Bytes(), &hangs); err != nil {
		t.Fatalf("find-hanging exited %d and printed %q (stderr %q): %v", code, stdout.String(), stderr.String(), err)
	}
	if want := map[bool]int{true: exitFound, false: exitOK}[len(hangs) > 0]; code != want {
		t.Fatalf("find-hanging exited %d listing %d hangs; want %d (stderr %q)", code, len(hangs), want, stderr.String())
	}
	return hangs
}

// runTool runs the command and returns its stdout and stderr together.
func runTool(ctx context.Context, args ...string) (string, int) {
	var out bytes.Buffer
	code := run(ctx, args, &out, &out)
	return out.String(), code
}

// Usage errors exit 2 before touching the network; a cluster that cannot
// be reached is an error that names where it looked, within -timeout.
func TestTxnCommandRefusesBadUsage(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		{},
		{"txn"},
		{"txn", "frobnicate"},
		{"txn", "describe"},
		{"txn", "close", "-topic", "t", "-partition", "0"},
		{"txn", "close", "-topic", "t", "-partition", "0", "-producer-id", "1", "-outcome", "maybe"},
	} {
		if out, code := runTool(ctx, args...); code != exitUsage {
			t.Errorf("%q exited %d, want %d: %s", args, code, exitUsage, out)
		}
	}
	start := time.Now()
	out, code := runTool(ctx, "txn", "find-hanging", "-brokers", "127.0.0.1:1", "-timeout", "2s")
	if code != exitError || !strings.Contains(out, "127.0.0.1:1") || time.Since(start) > 20*time.Second {
		t.Fatalf("an unreachable cluster: exit %d after %s: %s", code, time.Since(start), out)
	}
}

// On a cluster that authenticates every client and authorizes every
// request, find-hanging runs as an operator principal holding only Read on
// the topics it looks at and Describe on the transactional ids (no cluster
// right), and tells a live transaction from a hanging one. Without Read on the topic it fails naming the refusal. The
// password comes from $EOSKIT_SASL_PASSWORD and appears in no output.
func TestTxnCommandFindsHangingWithReadAndDescribeOnly(t *testing.T) {
	b := testbed.StartLocalBrokerWithACLs(t)
	k := b.KafkaCluster
	topic := k.NewTopic(2)
	k.SeedHostile(topic, 200, 50) // transactional producers on the topic
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A live transaction, so that find-hanging asks its coordinator
	// (ListTransactions, DescribeTransactions) and must tell it is live.
	live := k.Client(kgo.TransactionalID(integration.UniqueName(t, "live")), kgo.DefaultProduceTopic(topic))
	if err := live.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := live.ProduceSync(ctx, &kgo.Record{Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	ops := testbed.NewUser(t, b.KafkaCluster, "ops")
	results, err := k.Admin.CreateACLs(ctx, kadm.NewACLs().Topics(topic).TransactionalIDs("*").Allow(ops.Principal).Operations(kadm.OpRead, kadm.OpDescribe))
	if err == nil {
		for _, r := range results {
			err = errors.Join(err, r.Err)
		}
	}
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	t.Setenv("EOSKIT_SASL_PASSWORD", ops.Password)
	// -min-age 0: a transaction no describable id holds counts at once,
	// so that a missing Describe would show as a false hang.
	args := []string{"txn", "find-hanging", "-brokers=" + strings.Join(k.Brokers, ","), "-sasl-mechanism", "scram-sha-512", "-sasl-user", "ops", "-min-age", "0s"}
	out, code := runTool(ctx, append(args, "-topic", topic)...)
	if code != exitOK || !strings.Contains(out, "no hanging transactions") {
		t.Fatalf("find-hanging as ops exited %d: %s", code, out)
	}
	other := k.NewTopic(1)
	out2, code := runTool(ctx, append(args, "-topic", other)...)
	if code != exitError || !strings.Contains(out2, "TOPIC_AUTHORIZATION_FAILED") {
		t.Fatalf("find-hanging on a topic ops may not read exited %d: %s", code, out2)
	}
	if strings.Contains(out+out2, ops.Password) {
		t.Fatal("the output carries the password")
	}
	t.Setenv("EOSKIT_SASL_PASSWORD", "")
	if out, code := runTool(ctx, append(args, "-topic", topic)...); code != exitUsage {
		t.Fatalf("SASL without a password exited %d: %s", code, out)
	}

	t.Run("a live transaction that writes old record times is not hanging", func(t *testing.T) {
		findsALiveTransactionWithOldRecordTimesLive(t, b)
	})
}

// A principal without Describe on a transactional id sees its transaction
// held by no id, and ages it by its producer's last record time; an outbox
// relay stamps each record with its database commit time, so a live relay
// publishing a backlog looks hours old. find-hanging then must not list
// it: with -min-age it looks again after that long, and a transaction
// that wrote meanwhile is live (issue 43 item 22; on 7d16fbd find-hanging
// listed it at once, and the docs' advice led to aborting it). The
// negative control: once the producer stops writing, the same transaction
// is listed after -min-age.
func findsALiveTransactionWithOldRecordTimesLive(t *testing.T, b *testbed.LocalBroker) {
	k := b.KafkaCluster
	topic := k.NewTopic(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ops := testbed.NewUser(t, k, "ops-without-describe")
	results, err := k.Admin.CreateACLs(ctx, kadm.NewACLs().Topics(topic).Allow(ops.Principal).Operations(kadm.OpRead, kadm.OpDescribe))
	if err == nil {
		for _, r := range results {
			err = errors.Join(err, r.Err)
		}
	}
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	relay := k.Client(kgo.TransactionalID(integration.UniqueName(t, "relay")), kgo.DefaultProduceTopic(topic),
		kgo.TransactionTimeout(time.Minute))
	if err := relay.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	writing, stop := context.WithCancel(ctx)
	wrote, first := make(chan error, 1), make(chan struct{})
	go func() {
		for n := 0; writing.Err() == nil; n++ {
			if n == 1 {
				close(first)
			}
			// A backlog committed in the database an hour ago.
			r := &kgo.Record{Value: []byte("backlog"), Timestamp: time.Now().Add(-time.Hour)}
			if err := relay.ProduceSync(ctx, r).FirstErr(); err != nil {
				wrote <- err
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		wrote <- nil
	}()
	select {
	case <-first:
	case err := <-wrote:
		t.Fatalf("the relay's first write: %v", err)
	}
	t.Setenv("EOSKIT_SASL_PASSWORD", ops.Password)
	args := []string{"txn", "find-hanging", "-brokers=" + strings.Join(k.Brokers, ","), "-sasl-mechanism", "scram-sha-512",
		"-sasl-user", "ops-without-describe", "-min-age", "3s", "-topic", topic}
	out, code := runTool(ctx, args...)
	t.Logf("live: exit %d: %s", code, out)
	stop()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if code != exitOK || !strings.Contains(out, "no hanging transactions") {
		t.Fatalf("find-hanging listed a live transaction that writes old record times (exit %d):\n%s", code, out)
	}
	if !strings.Contains(out, "looking again in 3s") {
		t.Errorf("find-hanging did not say it waits -min-age to look again:\n%s", out)
	}
	// The negative control: an open transaction no write touches for
	// -min-age is listed. (Here a live one, idle within its 1-minute
	// timeout: why -min-age must outlast the cluster's longest
	// transaction timeout.)
	hangs := findHanging(ctx, t, "-brokers="+strings.Join(k.Brokers, ","), "-sasl-mechanism", "scram-sha-512",
		"-sasl-user", "ops-without-describe", "-min-age", "3s", "-topic", topic)
	if len(hangs) != 1 || hangs[0].TransactionalID != "" || !strings.Contains(hangs[0].Evidence, "no transactional id") {
		t.Fatalf("find-hanging listed %+v for the transaction its producer stopped writing to; want it, held by no describable id, so the check above proves something", hangs)
	}
	if err := relay.AbortBufferedRecords(ctx); err != nil {
		t.Fatal(err)
	}
	if err := relay.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
}
