package verify

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Output is one output record (or row) as the verifier sees it.
type Output struct {
	// ID names the input record this output stands for.
	ID string
	// Stream and Seq place the input in its stream (for a Kafka input: its
	// partition and offset). Outputs of one stream must appear in Seq
	// order within each output partition.
	Stream string
	Seq    int64
	// Position is where the output was read: a topic partition and offset,
	// or, for a table, any distinct value (Partition 0, Offset the row
	// number).
	Position Position
}

// Position is a record's place in a topic.
type Position struct {
	Topic     string
	Partition int32
	Offset    int64
}

func (p Position) String() string { return fmt.Sprintf("%s[%d]@%d", p.Topic, p.Partition, p.Offset) }

// Run is what the verifier checks: the inputs a run was fed, the outputs a
// read_committed reader saw, and the positions that aborted transactions
// wrote (from [AbortedPositions]).
type Run struct {
	Input   []string
	Output  []Output
	Aborted map[Position]bool
	// AbortedInput lists ids that were written to the input only by
	// transactions that aborted (as integration.SeedTransactional returns them): an
	// output of one means a consumer applied aborted data, and counts as
	// aborted-visible, wherever the output lives (a topic or a table).
	AbortedInput []string
}

// Finding is one kind of anomaly: how many, and the first few examples.
type Finding struct {
	Count    int
	Examples []string
}

const maxExamples = 5

func (f *Finding) add(example string) {
	f.Count++
	if len(f.Examples) < maxExamples {
		f.Examples = append(f.Examples, example)
	}
}

// Report is the verifier's verdict on a [Run].
type Report struct {
	Inputs, Outputs int
	// Lost: inputs with no output.
	Lost Finding
	// Duplicated: inputs with more than one output (Count is the number of
	// extra outputs).
	Duplicated Finding
	// AbortedVisible: outputs a read_committed reader saw at a position
	// that an aborted transaction wrote, and outputs of inputs that only
	// aborted transactions wrote.
	AbortedVisible Finding
	// OutOfOrder: outputs that came before an output of an earlier input
	// of the same stream, in the same output partition.
	OutOfOrder Finding
	// Unexpected: outputs whose input was never fed.
	Unexpected Finding
}

// OK reports whether the run had no anomaly at all.
func (r Report) OK() bool {
	return r.Lost.Count+r.Duplicated.Count+r.AbortedVisible.Count+r.OutOfOrder.Count+r.Unexpected.Count == 0
}

// Err returns nil for a clean run, and otherwise an error listing every
// anomaly with its count and first examples.
func (r Report) Err() error {
	if r.OK() {
		return nil
	}
	return errors.New("verifier: " + r.String())
}

func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "inputs=%d outputs=%d", r.Inputs, r.Outputs)
	for _, f := range []struct {
		name string
		f    Finding
	}{{"lost", r.Lost}, {"duplicated", r.Duplicated}, {"aborted-visible", r.AbortedVisible}, {"out-of-order", r.OutOfOrder}, {"unexpected", r.Unexpected}} {
		fmt.Fprintf(&b, " %s=%d", f.name, f.f.Count)
		if f.f.Count > 0 {
			fmt.Fprintf(&b, " %v", f.f.Examples)
		}
	}
	return b.String()
}

// Check checks run for lost, duplicated, aborted-but-visible, out-of-order
// and unexpected outputs. Outputs must be given in the order they were read,
// which within one partition is offset order.
func Check(run Run) Report {
	r := Report{Inputs: len(run.Input), Outputs: len(run.Output)}
	fed := make(map[string]bool, len(run.Input))
	for _, id := range run.Input {
		fed[id] = true
	}
	abortedInput := make(map[string]bool, len(run.AbortedInput))
	for _, id := range run.AbortedInput {
		abortedInput[id] = true
	}
	seen := make(map[string]int, len(run.Output))
	type streamInPartition struct {
		topic     string
		partition int32
		stream    string
	}
	last := map[streamInPartition]Output{}
	for _, o := range run.Output {
		if run.Aborted[o.Position] {
			r.AbortedVisible.add(fmt.Sprintf("%s at %s", o.ID, o.Position))
		}
		switch {
		case abortedInput[o.ID]:
			r.AbortedVisible.add(fmt.Sprintf("%s (an aborted input) at %s", o.ID, o.Position))
		case !fed[o.ID]:
			r.Unexpected.add(fmt.Sprintf("%s at %s", o.ID, o.Position))
		}
		seen[o.ID]++
		if seen[o.ID] > 1 {
			r.Duplicated.add(fmt.Sprintf("%s (copy %d at %s)", o.ID, seen[o.ID], o.Position))
		}
		k := streamInPartition{o.Position.Topic, o.Position.Partition, o.Stream}
		if prev, ok := last[k]; ok && o.Seq < prev.Seq {
			r.OutOfOrder.add(fmt.Sprintf("%s (seq %d) after %s (seq %d) in %s[%d]", o.ID, o.Seq, prev.ID, prev.Seq, o.Position.Topic, o.Position.Partition))
		}
		last[k] = o
	}
	lost := make([]string, 0)
	for id := range fed {
		if seen[id] == 0 {
			lost = append(lost, id)
		}
	}
	sort.Strings(lost)
	for _, id := range lost {
		r.Lost.add(id)
	}
	return r
}

// AbortedPositions returns the positions of the data records that aborted
// transactions wrote, reconstructed independently of the broker's
// read_committed filtering: recs must be a read_uncommitted read with
// control records kept (the test kit's integration.KafkaCluster.ReadRaw), in offset order per
// partition. A transactional record belongs to the next control marker of
// its producer in the same partition; an abort marker makes it aborted.
func AbortedPositions(recs []*kgo.Record) map[Position]bool {
	type producerInPartition struct {
		topic     string
		partition int32
		id        int64
	}
	pending := map[producerInPartition][]Position{}
	aborted := map[Position]bool{}
	for _, r := range recs {
		k := producerInPartition{r.Topic, r.Partition, r.ProducerID}
		pos := Position{r.Topic, r.Partition, r.Offset}
		switch {
		case r.Attrs.IsControl():
			// A control record's key is version (int16) then type
			// (int16): 0 abort, 1 commit.
			if len(r.Key) >= 4 && r.Key[2] == 0 && r.Key[3] == 0 {
				for _, p := range pending[k] {
					aborted[p] = true
				}
			}
			delete(pending, k)
		case r.Attrs.IsTransactional():
			pending[k] = append(pending[k], pos)
		}
	}
	return aborted
}
