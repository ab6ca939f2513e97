package patterns

import (
	"fmt"
	"strconv"
	"strings"
)

// Report is one regional case report: the shared workload. A duplicate
// report inflates its region's total and a lost one deflates it, so every
// anomaly shows in the numbers a dashboard would print.
type Report struct {
	ID     string
	Region string
	Cases  int
}

// Regions are the workload's regions; each maps to one input partition.
var Regions = []string{"north", "south", "east", "west"}

// Workload returns n reports spread over the regions, the same for every
// pattern and every run.
func Workload(n int) []Report {
	reports := make([]Report, n)
	for i := range reports {
		reports[i] = Report{ID: "r" + strconv.Itoa(i), Region: Regions[i%len(Regions)], Cases: 1 + (i*7)%9}
	}
	return reports
}

// Value encodes r as a record value: "id|region|cases".
func (r Report) Value() []byte { return fmt.Appendf(nil, "%s|%s|%d", r.ID, r.Region, r.Cases) }

// ParseReport decodes [Report.Value].
func ParseReport(b []byte) (Report, error) {
	parts := strings.Split(string(b), "|")
	if len(parts) != 3 {
		return Report{}, fmt.Errorf("patterns: %q is not id|region|cases", b)
	}
	cases, err := strconv.Atoi(parts[2])
	if err != nil {
		return Report{}, fmt.Errorf("patterns: %q: %w", b, err)
	}
	return Report{ID: parts[0], Region: parts[1], Cases: cases}, nil
}

// Totals sums cases per region.
func Totals(reports []Report) map[string]int {
	t := map[string]int{}
	for _, r := range reports {
		t[r.Region] += r.Cases
	}
	return t
}

func regionPartition(region string) int32 {
	for i, r := range Regions {
		if r == region {
			return int32(i)
		}
	}
	return 0
}
