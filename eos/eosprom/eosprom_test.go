package eosprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eosprom"
)

func TestMetricsCountWhatTheProcessorReports(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := eosprom.New(reg, eosprom.ConstLabels(prometheus.Labels{"app": "test"}))
	if err != nil {
		t.Fatal(err)
	}
	m.Committed(10, 20, 50*time.Millisecond)
	m.Committed(5, 5, 10*time.Millisecond)
	m.Aborted("rebalance", time.Millisecond)
	m.Rebalanced()
	m.Fenced()

	want := `
# HELP eoskit_processor_records_in_total Input records of committed transactions.
# TYPE eoskit_processor_records_in_total counter
eoskit_processor_records_in_total{app="test",path="eos"} 15
# HELP eoskit_processor_records_out_total Output records of committed transactions.
# TYPE eoskit_processor_records_out_total counter
eoskit_processor_records_out_total{app="test",path="eos"} 25
# HELP eoskit_processor_transactions_total Transactions (or batches, under the weaker semantics) ended, by outcome and abort reason.
# TYPE eoskit_processor_transactions_total counter
eoskit_processor_transactions_total{app="test",outcome="aborted",path="eos",reason="rebalance"} 1
eoskit_processor_transactions_total{app="test",outcome="committed",path="eos",reason=""} 2
# HELP eoskit_processor_rebalances_total Times the group took partitions from a runner.
# TYPE eoskit_processor_rebalances_total counter
eoskit_processor_rebalances_total{app="test",path="eos"} 1
# HELP eoskit_processor_fencings_total Times a newer instance with the same transactional id fenced a processor.
# TYPE eoskit_processor_fencings_total counter
eoskit_processor_fencings_total{app="test",path="eos"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"eoskit_processor_records_in_total", "eoskit_processor_records_out_total",
		"eoskit_processor_transactions_total", "eoskit_processor_rebalances_total", "eoskit_processor_fencings_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "eoskit_processor_transaction_duration_seconds"); n != 2 {
		t.Fatalf("duration histogram has %d series, want 2 (committed, aborted)", n)
	}

	// Restores, as the processor reports them: through the path's view.
	m.ForPath("eos", "g").(eos.RestoreMetrics).Restored("counts-changelog", 0, 10, 90, time.Second)
	m.Restored("counts-changelog", 1, 0, 10, time.Second)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP eoskit_processor_restored_records_total Changelog records applied by restores of keyed state.
# TYPE eoskit_processor_restored_records_total counter
eoskit_processor_restored_records_total{app="test",path="eos",topic="counts-changelog"} 100
# HELP eoskit_processor_restores_total Restores of a changelog partition (a store made current before its partition's first record).
# TYPE eoskit_processor_restores_total counter
eoskit_processor_restores_total{app="test",path="eos",topic="counts-changelog"} 2
`), "eoskit_processor_restored_records_total", "eoskit_processor_restores_total"); err != nil {
		t.Fatal(err)
	}

	// The other paths report through their own view, labelled.
	db := m.ForPath("offsetstore", "billing")
	// A runner of the same path in another group reading the same
	// partition keeps its own lag series.
	other := m.ForPath("offsetstore", "audit")
	db.Committed(7, 0, time.Millisecond)
	db.HandlerStarted()
	db.HandlerStarted()
	db.Handled(time.Millisecond, false)
	db.Handled(time.Millisecond, true)
	db.HandlerStarted()
	db.DeadLettered(3)
	db.Lag("in", 2, 40)
	other.Lag("in", 2, 7)
	want = `
# HELP eoskit_processor_records_in_total Input records of committed transactions.
# TYPE eoskit_processor_records_in_total counter
eoskit_processor_records_in_total{app="test",path="eos"} 15
eoskit_processor_records_in_total{app="test",path="offsetstore"} 7
# HELP eoskit_processor_handlers_in_flight Handler calls under way.
# TYPE eoskit_processor_handlers_in_flight gauge
eoskit_processor_handlers_in_flight{app="test",path="eos"} 0
eoskit_processor_handlers_in_flight{app="test",path="offsetstore"} 1
# HELP eoskit_processor_dead_letters_total Records dead-lettered in committed work.
# TYPE eoskit_processor_dead_letters_total counter
eoskit_processor_dead_letters_total{app="test",path="eos"} 0
eoskit_processor_dead_letters_total{app="test",path="offsetstore"} 3
# HELP eoskit_processor_lag Records after the last one polled, per partition, as of its last poll.
# TYPE eoskit_processor_lag gauge
eoskit_processor_lag{app="test",group="audit",partition="2",path="offsetstore",topic="in"} 7
eoskit_processor_lag{app="test",group="billing",partition="2",path="offsetstore",topic="in"} 40
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "eoskit_processor_records_in_total",
		"eoskit_processor_handlers_in_flight", "eoskit_processor_dead_letters_total", "eoskit_processor_lag"); err != nil {
		t.Fatal(err)
	}
	other.Lag("in", 2, -1) // revoked: only that group's series goes
	if n := testutil.CollectAndCount(reg, "eoskit_processor_lag"); n != 1 {
		t.Fatalf("%d lag series after one group's revocation, want 1", n)
	}
	if n := testutil.CollectAndCount(reg, "eoskit_processor_handler_duration_seconds"); n != 4 {
		t.Fatalf("handler histogram has %d series, want 4 (ok and error, per path)", n)
	}
	if _, err := eosprom.New(reg, eosprom.ConstLabels(prometheus.Labels{"app": "test"})); err == nil {
		t.Fatal("registering the same metrics twice succeeded")
	}
}
