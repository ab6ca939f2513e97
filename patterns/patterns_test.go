package patterns_test

import (
	"context"
	"testing"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/patterns"
)

// TestLabShowsWhatEachPatternGuarantees runs eoslab's scenarios against the
// real broker and PostgreSQL and asserts the outcomes the demo claims, so
// that it cannot silently stop demonstrating them: at-most-once loses,
// at-least-once duplicates (and never loses), and every exactly-once pattern
// does neither.
func TestLabShowsWhatEachPatternGuarantees(t *testing.T) {
	k := integration.Kafka(t)
	lab := &patterns.Lab{Brokers: k.Brokers, Pool: integration.Postgres(t), Reports: patterns.Workload(3000),
		Progress: func(pattern, step string) { t.Logf("%s: %s", pattern, step) }}
	for _, p := range patterns.All() {
		out, err := lab.Run(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%-30s input=%d output=%d lost=%d duplicated=%d aborted-visible=%d out-of-order=%d totals-correct=%v",
			out.Pattern, out.Input, out.Output, out.Lost, out.Duplicated, out.AbortedVisible, out.OutOfOrder, out.TotalsCorrect)
		if out.Skipped != "" {
			t.Fatalf("%s did not run: %s", p.Name, out.Skipped)
		}
		switch p.Name {
		case "at-most-once":
			// It may also duplicate: see the at-most-once pattern's doc.
			if out.Lost == 0 || out.TotalsCorrect {
				t.Errorf("at-most-once should lose: %v", out.Report)
			}
		case "at-least-once":
			if out.Lost != 0 || out.Duplicated == 0 || out.TotalsCorrect {
				t.Errorf("at-least-once should duplicate and never lose: %v", out.Report)
			}
		default:
			if !out.Report.OK() || !out.TotalsCorrect {
				t.Errorf("%s should be exactly once with correct totals: %v (totals %v)", p.Name, out.Report, out.Totals)
			}
		}
	}
}
