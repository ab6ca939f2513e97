package verify

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// CopyValue is the output value a copier writes for input record in.
func CopyValue(in *kgo.Record) []byte {
	return fmt.Appendf(nil, "%s|%d|%d", in.Key, in.Partition, in.Offset)
}

// DecodeOutputs turns output records written with [CopyValue] into the
// verifier's outputs.
func DecodeOutputs(recs []*kgo.Record) ([]Output, error) {
	outs := make([]Output, 0, len(recs))
	for _, r := range recs {
		parts := strings.Split(string(r.Value), "|")
		if len(parts) != 3 {
			return nil, fmt.Errorf("output %s[%d]@%d: value %q is not id|partition|offset", r.Topic, r.Partition, r.Offset, r.Value)
		}
		seq, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("output %s[%d]@%d: %w", r.Topic, r.Partition, r.Offset, err)
		}
		outs = append(outs, Output{ID: parts[0], Stream: parts[1], Seq: seq, Position: Position{r.Topic, r.Partition, r.Offset}})
	}
	return outs, nil
}
