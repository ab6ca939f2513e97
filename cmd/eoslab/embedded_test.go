package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/eoskit/eoskit/cmd/eoslab/internal/eoslab"
)

// TestEmbeddedLabShowsAllNineRows runs what `go run ./cmd/eoslab` runs on
// a machine with no services (no DATABASE_URL, no KAFKA_BROKERS: the
// in-process kfake cluster and the embedded PostgreSQL) and asserts every
// row's outcome, so that the README's first command keeps showing all
// nine. When the PostgreSQL binaries cannot be had it skips, saying why,
// except under EOS_REQUIRE_SERVICES=1, where that is a failure.
func TestEmbeddedLabShowsAllNineRows(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("KAFKA_BROKERS", "")
	var stdout, stderr bytes.Buffer
	code := run([]string{"--json", "--reports", "1000"}, &stdout, &stderr)
	t.Logf("eoslab exited %d; stderr:\n%s", code, stderr.String())
	if reason := noPostgres(stderr.String()); reason != "" {
		if os.Getenv("EOS_REQUIRE_SERVICES") == "1" {
			t.Fatal(reason)
		}
		t.Skip(reason)
	}
	var outcomes []eoslab.Outcome
	if err := json.Unmarshal(stdout.Bytes(), &outcomes); err != nil {
		t.Fatalf("eoslab --json printed %q: %v", stdout.String(), err)
	}
	if want := len(eoslab.All()); len(outcomes) != want || want != 9 {
		t.Errorf("%d rows of %d patterns; want all nine", len(outcomes), want)
	}
	for _, o := range outcomes {
		t.Logf("%-30s input=%d output=%d lost=%d duplicated=%d aborted-visible=%d out-of-order=%d totals-correct=%v",
			o.Pattern, o.Input, o.Output, o.Lost, o.Duplicated, o.AbortedVisible, o.OutOfOrder, o.TotalsCorrect)
		switch {
		case o.Skipped != "":
			t.Errorf("%s did not run: %s", o.Pattern, o.Skipped)
		case strings.HasPrefix(o.Pattern, "at-most-once"):
			if o.Lost == 0 || o.TotalsCorrect {
				t.Errorf("%s should lose reports and get the totals wrong", o.Pattern)
			}
		case strings.Contains(o.Pattern, "totals in a map"):
			if o.Lost != 0 || o.Duplicated != 0 || o.TotalsVerdict != "no" || o.DaysVerdict != "no" {
				t.Errorf("%s should be exactly once in its outputs, and get the totals and days wrong (totals %v, days %q)", o.Pattern, o.Totals, o.DaysVerdict)
			}
		case o.Pattern == "exactly-once kafka→kafka":
			if o.Lost != 0 || o.Duplicated != 0 || o.TotalsVerdict != "yes" || o.DaysVerdict != "yes" || o.Finals == 0 || o.LateReports == 0 {
				t.Errorf("%s should be exactly once with correct totals and days (days %q: %d wrong, %d finals, %d late)", o.Pattern, o.DaysVerdict, o.DaysWrong, o.Finals, o.LateReports)
			}
		case strings.HasPrefix(o.Pattern, "at-least-once"):
			if o.Lost != 0 || o.Duplicated == 0 || o.TotalsCorrect {
				t.Errorf("%s should never lose, duplicate some, and get the totals wrong", o.Pattern)
			}
		default:
			if o.Input == 0 || o.Lost != 0 || o.Duplicated != 0 || o.AbortedVisible != 0 || o.OutOfOrder != 0 || o.TotalsVerdict != "yes" {
				t.Errorf("%s should be exactly once with correct totals", o.Pattern)
			}
		}
	}
	if code != 0 {
		t.Errorf("eoslab exited %d; want 0", code)
	}
}

// noPostgres returns eoslab's line saying why it has no embedded
// PostgreSQL, or "".
func noPostgres(stderr string) string {
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, "no embedded PostgreSQL") {
			return line
		}
	}
	return ""
}
