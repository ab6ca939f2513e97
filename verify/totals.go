package verify

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
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

// LastCounts reads a stream of counts or sums that only grow (the updates
// of an aggregation, or its changelog: decimal values by key, one per key
// per transaction) in the order recs were read, and returns each key's
// last value and the places where a key's value did not grow: the same
// value again or a smaller one, which is an update applied twice, one of
// an aborted transaction made visible, or a count started over from a
// state that was lost. A value that is not a decimal integer is an error.
func LastCounts(recs []*kgo.Record) (last map[string]int64, notGrowing []Position, err error) {
	last = map[string]int64{}
	for _, r := range recs {
		n, err := strconv.ParseInt(string(r.Value), 10, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("verify: %s[%d]@%d: key %q holds %q, not a count", r.Topic, r.Partition, r.Offset, r.Key, r.Value)
		}
		key := string(r.Key)
		if prev, seen := last[key]; seen && n <= prev {
			notGrowing = append(notGrowing, Position{r.Topic, r.Partition, r.Offset})
		}
		last[key] = n
	}
	return last, notGrowing, nil
}
