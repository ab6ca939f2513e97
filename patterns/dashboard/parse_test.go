package dashboard_test

import (
	"testing"

	"github.com/eoskit/eoskit/patterns/dashboard"
)

// A value that is not a report, or whose time does not parse, is refused
// with what is wrong with it.
func TestParseRefusesWhatIsNotAReport(t *testing.T) {
	for _, v := range []string{"r1|north", "r1|north|2|2026-12-01T00:00:00Z|x", "r1|north|two", "r1|north|2|yesterday", "r1|north|2|"} {
		if rep, err := dashboard.Parse([]byte(v)); err == nil {
			t.Errorf("Parse(%q) = %+v; want an error", v, rep)
		}
	}
}
