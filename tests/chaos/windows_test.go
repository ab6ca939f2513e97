package chaos_test

import (
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/verify"
)

// countsByKey is the true count per region of the committed inputs: what
// the by-key counting paths must end at.
func countsByKey(inputs []string) map[string]int64 {
	want := map[string]int64{}
	for _, id := range inputs {
		want[regionOf(id)]++
	}
	return want
}

// reportTime is count-window's record time for input id: 5 ms apart in id
// order from base, but every 7th 3 s behind (inside the grace period, or
// in an earlier window still open) and every 11th 15 s behind (past it,
// most often: late). Aborted inputs are 50 minutes ahead (under the
// broker's hour, message.timestamp.after.max.ms): seen, one would move
// stream time there and make every later input late.
func reportTime(base time.Time, id string) time.Time {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	t := base.Add(time.Duration(n) * 5 * time.Millisecond)
	switch {
	case strings.HasPrefix(id, "aborted-"):
		return t.Add(50 * time.Minute)
	case n%11 == 0:
		return t.Add(-15 * time.Second)
	case n%7 == 0:
		return t.Add(-3 * time.Second)
	}
	return t
}

// windowTruth is the true count per region and window of count-window's
// committed input (verify.CountWindows, whose rules are written apart
// from package window's); the copier's grace is truncated to
// milliseconds, as here.
func windowTruth(k *integration.KafkaCluster, in string) map[string]int64 {
	return verify.CountWindows(k.ReadAll(in, kgo.ReadCommitted(), 2*time.Minute), windowSize, (windowSize / 3).Truncate(time.Millisecond)).Counts
}
