package eosprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
eoskit_processor_records_in_total{app="test"} 15
# HELP eoskit_processor_records_out_total Output records of committed transactions.
# TYPE eoskit_processor_records_out_total counter
eoskit_processor_records_out_total{app="test"} 25
# HELP eoskit_processor_transactions_total Transactions (or batches, under the weaker semantics) ended, by outcome and abort reason.
# TYPE eoskit_processor_transactions_total counter
eoskit_processor_transactions_total{app="test",outcome="aborted",reason="rebalance"} 1
eoskit_processor_transactions_total{app="test",outcome="committed",reason=""} 2
# HELP eoskit_processor_rebalances_total Times the group took partitions from a processor.
# TYPE eoskit_processor_rebalances_total counter
eoskit_processor_rebalances_total{app="test"} 1
# HELP eoskit_processor_fencings_total Times a newer instance with the same transactional id fenced a processor.
# TYPE eoskit_processor_fencings_total counter
eoskit_processor_fencings_total{app="test"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"eoskit_processor_records_in_total", "eoskit_processor_records_out_total",
		"eoskit_processor_transactions_total", "eoskit_processor_rebalances_total", "eoskit_processor_fencings_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "eoskit_processor_transaction_duration_seconds"); n != 2 {
		t.Fatalf("duration histogram has %d series, want 2 (committed, aborted)", n)
	}
	if _, err := eosprom.New(reg, eosprom.ConstLabels(prometheus.Labels{"app": "test"})); err == nil {
		t.Fatal("registering the same metrics twice succeeded")
	}
}
