package eoslab

import (
	"strconv"
	"time"

	"github.com/eoskit/eoskit/patterns/dashboard"
)

// regions are the workload's regions; each maps to one input partition.
var regions = []string{"north", "south", "east", "west"}

// workloadStart is when the workload's first case was reported.
var workloadStart = time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC)

// Workload returns n case reports spread over the regions, the same for
// every pattern and every run. They were reported six minutes apart from
// workloadStart on (4,000 reports span 17 days), but not all come in
// order: every fifth says it was reported 50 minutes earlier (its day's
// grace takes it when that crosses midnight), and every thirteenth two
// days earlier (late: its day closed).
func Workload(n int) []dashboard.Report {
	reports := make([]dashboard.Report, n)
	for i := range reports {
		at := workloadStart.Add(time.Duration(i) * 6 * time.Minute)
		switch {
		case i > 0 && i%13 == 0:
			at = at.Add(-49 * time.Hour)
		case i%5 == 0:
			at = at.Add(-50 * time.Minute)
		}
		reports[i] = dashboard.Report{ID: "r" + strconv.Itoa(i), Region: regions[i%len(regions)], Cases: 1 + (i*7)%9, ReportedAt: at}
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
