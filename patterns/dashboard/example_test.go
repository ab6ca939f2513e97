package dashboard_test

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/patterns/dashboard"
)

// A report as it travels: a record keyed by its region, decoded back on
// the other side.
func ExampleReport_Record() {
	rec := dashboard.Report{ID: "r7", Region: "north", Cases: 4}.Record("case-reports")
	rep, err := dashboard.Parse(rec.Value)
	fmt.Printf("%s key=%s value=%s\n%s %s %d %v\n", rec.Topic, rec.Key, rec.Value, rep.ID, rep.Region, rep.Cases, err)
	// Output:
	// case-reports key=north value=r7|north|4
	// r7 north 4 <nil>
}

// The time a report counts in its day by: the one it says, else its
// record's timestamp.
func ExampleReportedAt() {
	at := time.Date(2026, 12, 1, 23, 40, 0, 0, time.UTC)
	said := dashboard.Report{ID: "r8", Region: "north", Cases: 2, ReportedAt: at}.Record("case-reports")
	unsaid := dashboard.Report{ID: "r9", Region: "north", Cases: 1}.Record("case-reports")
	unsaid.Timestamp = at.Add(time.Hour)
	for _, rec := range []*kgo.Record{said, unsaid} {
		t, err := dashboard.ReportedAt(rec)
		fmt.Printf("%s: %s %v\n", rec.Value, t.UTC().Format(time.RFC3339), err)
	}
	// Output:
	// r8|north|2|2026-12-01T23:40:00.000Z: 2026-12-01T23:40:00Z <nil>
	// r9|north|1: 2026-12-02T00:40:00Z <nil>
}
