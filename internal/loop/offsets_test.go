package loop

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Offsets read as numbers or as where they point, sorted, never as
// franz-go's internal fields ("{-2 e-1 ce0}").
func TestFormatOffsets(t *testing.T) {
	got := FormatOffsets(map[string]map[int32]kgo.Offset{
		"orders":   {1: kgo.NewOffset().AtStart(), 0: kgo.NewOffset().At(6000).WithEpoch(-1), 10: kgo.NewOffset().AtEnd()},
		"payments": {0: kgo.NewOffset().AtCommitted(), 2: kgo.NewOffset().At(0)},
	})
	want := "orders[0]=6000 orders[1]=start orders[10]=end payments[0]=committed payments[2]=0"
	if got != want {
		t.Errorf("FormatOffsets = %q; want %q", got, want)
	}
	if got := FormatOffsets(nil); got != "" {
		t.Errorf("FormatOffsets(nil) = %q; want empty", got)
	}
}
