package eoslab_test

import (
	"context"
	"strings"
	"testing"

	"github.com/eoskit/eoskit/cmd/eoslab/internal/eoslab"
	"github.com/eoskit/eoskit/integration"
)

// TestLabShowsWhatEachPatternGuarantees runs eoslab's scenarios against the
// real broker and PostgreSQL and asserts the outcomes the demo claims, so
// that it cannot silently stop demonstrating them: at-most-once loses,
// at-least-once duplicates (and never loses), totals kept in a map outside
// the transaction come out wrong, and every exactly-once pattern does
// neither, its totals right.
func TestLabShowsWhatEachPatternGuarantees(t *testing.T) {
	t.Parallel() // the real-broker lab and the embedded one side by side
	k := integration.Kafka(t)
	lab := &eoslab.Lab{Brokers: k.Brokers, Pool: integration.Postgres(t), Reports: eoslab.Workload(3000),
		Progress: func(pattern, step string) { t.Logf("%s: %s", pattern, step) }}
	for _, p := range eoslab.All() {
		checkPattern(t, lab, p)
	}
}

// TestEmbeddedLabShowsWhatEachPatternGuarantees runs what `go run
// ./cmd/eoslab` runs with no services (every Kafka pattern, every fault, on
// the embedded kfake cluster) with the same assertions as the real-broker
// test, so that the README's first command is kept working.
func TestEmbeddedLabShowsWhatEachPatternGuarantees(t *testing.T) {
	t.Parallel() // the real-broker lab and the embedded one side by side
	cluster, err := eoslab.EmbeddedCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	lab := &eoslab.Lab{Brokers: cluster.ListenAddrs(), SessionTimeout: eoslab.EmbeddedSessionTimeout,
		Progress: func(pattern, step string) { t.Logf("%s: %s", pattern, step) }}
	ran := 0
	for _, p := range eoslab.All() {
		if p.NeedsDatabase {
			continue
		}
		checkPattern(t, lab, p)
		ran++
	}
	if ran < 5 {
		t.Fatalf("only %d Kafka patterns ran; want at-most-once, at-least-once, totals in a map, exactly-once and producer resume", ran)
	}
}

// checkPattern runs p and asserts what it must show.
func checkPattern(t *testing.T, lab *eoslab.Lab, p eoslab.Pattern) {
	t.Helper()
	out, err := lab.Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%-30s input=%d output=%d lost=%d duplicated=%d aborted-visible=%d out-of-order=%d totals-correct=%v days=%q (%d wrong) faults=%q in %s",
		out.Pattern, out.Input, out.Output, out.Lost, out.Duplicated, out.AbortedVisible, out.OutOfOrder, out.TotalsCorrect, out.DaysVerdict, out.DaysWrong, out.Faults, out.Duration)
	if out.Skipped != "" {
		t.Fatalf("%s did not run: %s", p.Name, out.Skipped)
	}
	// The source's unknown outcomes alone lose or duplicate a few reports;
	// the consumer-side faults (crash, rebalance, zombie) must add to them,
	// or they did not land.
	ackLost, notWritten := lab.UnknownOutcomes()
	if !p.NeedsDatabase && p.Name != "exactly-once producer resume" && len(out.Faults) != 4 {
		t.Errorf("%s: faults %q; want the source's and three consumer-side faults, each with its evidence", p.Name, out.Faults)
	}
	switch p.Name {
	case "at-most-once":
		// It may also duplicate: see the at-most-once pattern's doc.
		if out.Lost <= notWritten || out.TotalsCorrect {
			t.Errorf("at-most-once should lose more than the %d reports its source never wrote: %v", notWritten, out.Report)
		}
	case "at-least-once outbox relay":
		if out.Lost != 0 || out.Duplicated == 0 || out.TotalsCorrect {
			t.Errorf("the at-least-once relay should never lose, and duplicate the batches its crashes left unconfirmed: %v", out.Report)
		}
	case "kafka→kafka, totals in a map":
		// Its outputs are the pattern's, exactly once; its totals and
		// days are not.
		if !out.Report.OK() || out.TotalsCorrect || out.TotalsVerdict != "no" || out.DaysVerdict != "no" {
			t.Errorf("totals in a map should be exactly once in its outputs and wrong in its totals and days: %v (totals %v, verdict %q, days %q)",
				out.Report, out.Totals, out.TotalsVerdict, out.DaysVerdict)
		}
	case "at-least-once":
		if out.Lost != 0 || out.Duplicated <= ackLost || out.TotalsCorrect {
			t.Errorf("at-least-once should never lose, and duplicate more than the %d reports its source resent: %v", ackLost, out.Report)
		}
	case "exactly-once kafka→kafka":
		// The days: late reports among the input, days that closed
		// (finals published), and every count and final right.
		if !out.Report.OK() || !out.TotalsCorrect || out.TotalsVerdict != "yes" || out.DaysVerdict != "yes" || out.LateReports == 0 || out.Finals == 0 {
			t.Errorf("%s should be exactly once with correct totals and days: %v (totals %v; days %q: %d wrong of %d, %d late, %d finals)",
				p.Name, out.Report, out.Totals, out.DaysVerdict, out.DaysWrong, out.Days, out.LateReports, out.Finals)
		}
		// Its instances run two processors: the consumer-side faults
		// catch each, and each fault's evidence names the one it caught.
		caught := map[string]int{}
		for i, f := range out.Faults {
			if i == 0 { // the source's
				continue
			}
			switch {
			case strings.Contains(f, "(totals processor)"):
				caught["totals"]++
			case strings.Contains(f, "(daily counts processor)"):
				caught["daily counts"]++
			default:
				t.Errorf("%s: fault %q does not name the processor it caught", p.Name, f)
			}
		}
		if caught["totals"] == 0 || caught["daily counts"] == 0 {
			t.Errorf("%s: the faults caught %v; want both processors mid-batch", p.Name, caught)
		}
	default:
		if !out.Report.OK() || !out.TotalsCorrect || out.TotalsVerdict != "yes" {
			t.Errorf("%s should be exactly once with correct totals: %v (totals %v)", p.Name, out.Report, out.Totals)
		}
	}
}
