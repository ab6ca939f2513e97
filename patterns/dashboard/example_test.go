package dashboard_test

import (
	"fmt"

	"github.com/eoskit/eoskit/patterns/dashboard"
)

// A report as it travels: a record keyed by its region, decoded back on
// the other side.
func ExampleReport_Record() {
	rec := dashboard.Report{ID: "r7", Region: "north", Cases: 4}.Record("case-reports")
	rep, err := dashboard.Parse(rec.Value)
	fmt.Printf("%s key=%s value=%s\n%+v %v\n", rec.Topic, rec.Key, rec.Value, rep, err)
	// Output:
	// case-reports key=north value=r7|north|4
	// {ID:r7 Region:north Cases:4} <nil>
}
