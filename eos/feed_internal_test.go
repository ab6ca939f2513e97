package eos

import (
	"testing"
	"time"
)

// A lane's quota follows the time recent records took, within 1 and
// pollPerLane, and is one record until a record's time is known.
func TestLaneQuota(t *testing.T) {
	rn := &runner{}
	if q := rn.quota(100 * time.Millisecond); q != 1 {
		t.Errorf("quota before any record: %d, want 1", q)
	}
	rn.took(5 * time.Millisecond)
	if q := rn.quota(100 * time.Millisecond); q != 20 {
		t.Errorf("quota for 100 ms at 5 ms a record: %d, want 20", q)
	}
	if q := rn.quota(time.Millisecond); q != 1 {
		t.Errorf("quota for less than a record's time: %d, want 1", q)
	}
	if q := rn.quota(time.Hour); q != pollPerLane {
		t.Errorf("quota for an hour: %d, want the poll's bound %d", q, pollPerLane)
	}
	for range 100 {
		rn.took(time.Millisecond)
	}
	if q := rn.quota(100 * time.Millisecond); q < 95 || q > 105 {
		t.Errorf("quota once records take 1 ms: %d, want about 100", q)
	}
}

// A batch's deadline moves at most two commit intervals past its start,
// and never past two thirds of the transaction's budget: with an interval
// of half the transaction timeout (the most NewProcessor accepts), not at
// all.
func TestExtendedIntervalStaysWithinTheBudget(t *testing.T) {
	for _, c := range []struct {
		interval, budget, want time.Duration
	}{
		{100 * time.Millisecond, 30 * time.Second, 200 * time.Millisecond},
		{10 * time.Second, 30 * time.Second, 20 * time.Second},
		{20 * time.Second, 30 * time.Second, 20 * time.Second}, // timeout 40 s, interval 20 s
		{100 * time.Millisecond, 0, 200 * time.Millisecond},    // no budget outside transactions
	} {
		rn := &runner{p: &Processor{cfg: &config{commitInterval: c.interval}}, budget: c.budget}
		if got := rn.extendedInterval(); got != c.want {
			t.Errorf("interval %s, budget %s: extended to %s, want %s", c.interval, c.budget, got, c.want)
		}
	}
}
