package eoslab

import (
	"strconv"

	"github.com/eoskit/eoskit/patterns/dashboard"
)

// regions are the workload's regions; each maps to one input partition.
var regions = []string{"north", "south", "east", "west"}

// Workload returns n case reports spread over the regions, the same for
// every pattern and every run.
func Workload(n int) []dashboard.Report {
	reports := make([]dashboard.Report, n)
	for i := range reports {
		reports[i] = dashboard.Report{ID: "r" + strconv.Itoa(i), Region: regions[i%len(regions)], Cases: 1 + (i*7)%9}
	}
	return reports
}

// totals sums cases per region: what an exact dashboard shows.
func totals(reports []dashboard.Report) map[string]int {
	t := map[string]int{}
	for _, r := range reports {
		t[r.Region] += r.Cases
	}
	return t
}

func regionPartition(region string) int32 {
	for i, r := range regions {
		if r == region {
			return int32(i)
		}
	}
	return 0
}
