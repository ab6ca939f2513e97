package eos_test

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/testsupport/contract"
	"github.com/eoskit/eoskit/window"
)

// The handler error shapes the world makes (contract.Shapes: a
// *net.OpError, io.EOF, context.DeadlineExceeded, each wrapped, and a
// panic), returned or raised by the functions a user gives the join, the
// windowed aggregation and the grouping (JoinTable's join,
// WindowedAggregate's add, NewGrouped's key), reach the contract's policy
// as the function gave them: classified by errors.Is and errors.As (a
// runner that flattened them would Stop instead), each such record
// dead-lettered with its cause and offset, and every other record's
// result exact.
func TestUserFunctionErrorShapesAreTheRecords(t *testing.T) {
	for _, shape := range contract.Shapes() {
		t.Run(shape.Name, func(t *testing.T) {
			t.Parallel()
			fail := func(off int64) error {
				if shape.Panics {
					panic(shape.Err(off))
				}
				return shape.Err(off)
			}
			t.Run("join", func(t *testing.T) { t.Parallel(); joinShape(t, shape, fail) })
			t.Run("windowed", func(t *testing.T) { t.Parallel(); windowedShape(t, shape, fail) })
			t.Run("grouped", func(t *testing.T) { t.Parallel(); groupedShape(t, shape, fail) })
		})
	}
}

// checkDeadLetters checks that the dead letters of topic are the records
// at offsets of input (partition → offsets), each with its shape's cause.
func checkDeadLetters(t *testing.T, brokers []string, topic, input string, shape contract.Shape, offsets map[string]bool) {
	t.Helper()
	got := map[string]bool{}
	for _, r := range readCommitted(t, brokers, topic) {
		at := headerOf(r, "eoskit-source-partition") + "/" + headerOf(r, "eoskit-source-offset")
		off, err := strconv.ParseInt(headerOf(r, "eoskit-source-offset"), 10, 64)
		if err != nil || headerOf(r, "eoskit-source-topic") != input {
			t.Fatalf("a dead letter without its source: %s", describe([]*kgo.Record{r}))
		}
		if got[at] {
			t.Fatalf("%s dead-lettered twice", at)
		}
		got[at] = true
		cause := headerOf(r, "eoskit-error")
		for _, want := range append([]string{shape.Err(off).Error()}, shape.Kept...) {
			if !strings.Contains(cause, want) {
				t.Fatalf("the dead letter of %s keeps %q, which does not say %q", at, cause, want)
			}
		}
	}
	if !maps.Equal(got, offsets) || len(offsets) == 0 {
		t.Fatalf("dead-lettered %v, want the failing records %v", got, offsets)
	}
}

// joinShape: cases joined with region names (seedJoin's), its bad cases
// failing in the join.
func joinShape(t *testing.T, shape contract.Shape, fail func(int64) error) {
	brokers, seed := joinCluster(t, "cases", "regions", "joined", "dead")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seedJoin(t, ctx, func(rs ...*kgo.Record) error { return seed.ProduceSync(ctx, rs...).FirstErr() }, time.Now().Add(-time.Hour), 300)
	table := eos.NewTable("regions")
	bad := map[string]bool{} // the bad cases, as written
	for _, r := range readCommitted(t, brokers, "cases") {
		if string(r.Value) == "bad" {
			bad[fmt.Sprintf("%d/%d", r.Partition, r.Offset)] = true
		}
	}
	join := func(ctx context.Context, r *kgo.Record, value []byte, ok bool) ([]*kgo.Record, error) {
		if string(r.Value) == "bad" {
			return nil, fail(r.Offset)
		}
		return joinCases(ctx, r, value, ok)
	}
	p, err := eos.NewProcessor(eos.JoinTable(table, join), append(joinOpts(t, brokers, table), eos.OnHandlerError(contract.Policy(eos.DeadLetter("dead"))))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, ctx, p.Run)
	waitCommitted(t, ctx, kadm.NewClient(seed), "join", "cases")
	stop()
	checkJoin(t, []kgo.Opt{kgo.SeedBrokers(brokers...)}, "cases", "regions", "joined")
	checkDeadLetters(t, brokers, "dead", "cases", shape, bad)
}

// windowedShape: reports counted per minute by a general aggregate whose
// add fails for the reports of key "bad".
func windowedShape(t *testing.T, shape contract.Shape, fail func(int64) error) {
	brokers := windowCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seed := reportsClient(t, brokers)
	want, bad := map[string]string{}, map[string]bool{}
	counts := map[string]int{}
	for i := range 120 {
		key := []string{"north", "south", "bad"}[i%3]
		at := day0.Add(time.Duration(i) * 2 * time.Second)
		r, err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte(key), Timestamp: at}).First()
		if err != nil {
			t.Fatal(err)
		}
		if key == "bad" {
			bad[fmt.Sprintf("0/%d", r.Offset)] = true
			continue
		}
		counts[fmt.Sprintf("%s@%s", key, at.Truncate(time.Minute).Format("01-02T15:04"))]++
	}
	for k, n := range counts {
		want[k] = strconv.Itoa(n)
	}
	h, err := eos.WindowedAggregate(window.Tumbling(time.Minute, time.Hour), func(agg []byte, r *kgo.Record) ([]byte, error) {
		if string(r.Key) == "bad" {
			return nil, fail(r.Offset)
		}
		n, err := state.Int64(agg)
		if agg == nil {
			n, err = 0, nil
		}
		return []byte(strconv.FormatInt(n+1, 10)), err
	})
	if err != nil {
		t.Fatal(err)
	}
	txnID, _ := eos.StableTransactionalID("windows", "0")
	p, err := eos.NewProcessor(h, eos.Brokers(brokers...), eos.Group("windows"), eos.Topics("reports"), eos.TransactionalID(txnID),
		eos.CommitInterval(20*time.Millisecond), eos.OnHandlerError(contract.Policy(eos.DeadLetter("dead-letters"))), eos.Logger(testLogger(t)),
		eos.Changelog("windows-changelog", eos.CreateChangelog(), eos.EmitUpdates("updates")))
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, ctx, p.Run)
	waitCommitted(t, ctx, kadm.NewClient(seed), "windows", "reports")
	stop()
	if got := lastByKey(t, readCommitted(t, brokers, "updates")); !maps.Equal(got, want) {
		t.Fatalf("windows %v, want %v", got, want)
	}
	checkDeadLetters(t, brokers, "dead-letters", "reports", shape, bad)
}

// groupedShape: reports counted by region through the repartition topic,
// the key function failing for a report without one.
func groupedShape(t *testing.T, shape contract.Shape, fail func(int64) error) {
	brokers := groupedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seed := reportsClient(t, brokers)
	counts, bad := map[string]int{}, map[string]bool{}
	for i := range 150 {
		region := []string{"north", "south", "east", "west", ""}[i%5]
		r, err := seed.ProduceSync(ctx, &kgo.Record{Key: []byte("r-" + strconv.Itoa(i)), Value: []byte(region)}).First()
		if err != nil {
			t.Fatal(err)
		}
		if region == "" {
			bad[fmt.Sprintf("%d/%d", r.Partition, r.Offset)] = true
			continue
		}
		counts[region]++
	}
	want := map[string]string{}
	for r, n := range counts {
		want[r] = strconv.Itoa(n)
	}
	key := func(r *kgo.Record) ([]byte, error) {
		if len(r.Value) == 0 {
			return nil, fail(r.Offset)
		}
		return r.Value, nil
	}
	g, err := eos.NewGrouped(key, "by-region", eos.Count(), append(groupedOpts(t, brokers), eos.OnHandlerError(contract.Policy(eos.DeadLetter("dead-letters"))))...)
	if err != nil {
		t.Fatal(err)
	}
	stop := runFor(t, ctx, g.Run)
	got := map[string]string{}
	for !maps.Equal(got, want) && ctx.Err() == nil {
		for _, r := range readCommitted(t, brokers, "counts") {
			got[string(r.Key)] = string(r.Value)
		}
	}
	stop()
	if !maps.Equal(got, want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	checkDeadLetters(t, brokers, "dead-letters", "reports", shape, bad)
}

// runFor runs run until the returned stop is called, which fails t if
// run returned an error (or returned before it); a test that fails first
// ends the run as it ends, and waits for it.
func runFor(t *testing.T, ctx context.Context, run func(context.Context) error) (stop func()) {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	done, finished := make(chan error, 1), make(chan struct{})
	go func() {
		done <- run(runCtx)
		close(finished)
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	return func() {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("Run returned before it was stopped: %v", err)
		default:
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}
