package verify

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// CheckTotals compares the totals a pipeline keeps (got: a count or a sum
// per key, a region's reports, an account's balance) with those its input
// adds up to (want), for pipelines whose results are aggregates, where no
// output row per input is left to check. It returns nil when they are the
// same for every key, else an error listing each key that differs, by how
// much and in which direction: short (input lost, or not processed yet)
// or over (input applied twice). A key with a total of 0 counts as absent.
func CheckTotals(want, got map[string]int64) error {
	keys := slices.Sorted(maps.Keys(want))
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	var diffs []string
	for _, k := range keys {
		switch w, g := want[k], got[k]; {
		case g < w:
			diffs = append(diffs, fmt.Sprintf("%s: %d, want %d (%d short)", k, g, w, w-g))
		case g > w:
			diffs = append(diffs, fmt.Sprintf("%s: %d, want %d (%d over)", k, g, w, g-w))
		}
	}
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("verify: %d of %d totals differ: %s", len(diffs), len(keys), strings.Join(diffs, "; "))
}
