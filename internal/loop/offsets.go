package loop

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// FormatOffsets writes offsets for a log line, sorted by topic and
// partition: "orders[0]=6000 orders[1]=start". An offset is its number, or
// "start", "end" or "committed" for franz-go's symbolic offsets; franz-go's
// own String prints its internal fields ("{-2 e-1 ce0}").
func FormatOffsets(offsets map[string]map[int32]kgo.Offset) string {
	var b strings.Builder
	for _, topic := range slices.Sorted(maps.Keys(offsets)) {
		for _, p := range slices.Sorted(maps.Keys(offsets[topic])) {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(topic + "[" + strconv.Itoa(int(p)) + "]=" + OffsetText(offsets[topic][p]))
		}
	}
	return b.String()
}

// OffsetText is o as a number, or "start", "end" or "committed".
func OffsetText(o kgo.Offset) string {
	switch at := o.EpochOffset().Offset; {
	case at >= 0:
		return strconv.FormatInt(at, 10)
	case at == kgo.NewOffset().AtStart().EpochOffset().Offset:
		return "start"
	case at == kgo.NewOffset().AtEnd().EpochOffset().Offset:
		return "end"
	case at == kgo.NewOffset().AtCommitted().EpochOffset().Offset:
		return "committed"
	default:
		return strconv.FormatInt(at, 10)
	}
}
