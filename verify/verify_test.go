package verify

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// cleanRun is three inputs of stream "0" copied in order to partition 0.
func cleanRun() Run {
	run := Run{Input: []string{"a", "b", "c"}, Aborted: map[Position]bool{}}
	for i, id := range run.Input {
		run.Output = append(run.Output, Output{ID: id, Stream: "0", Seq: int64(i), Position: Position{"out", 0, int64(i)}})
	}
	return run
}

func TestVerifyNamesEachPlantedAnomaly(t *testing.T) {
	tests := []struct {
		name  string
		plant func(*Run)
		count func(Report) Finding
	}{
		{"lost", func(r *Run) { r.Output = r.Output[:2] }, func(r Report) Finding { return r.Lost }},
		{"duplicated", func(r *Run) {
			r.Output = append(r.Output, Output{ID: "c", Stream: "0", Seq: 2, Position: Position{"out", 0, 3}})
		}, func(r Report) Finding { return r.Duplicated }},
		{"aborted-visible", func(r *Run) { r.Aborted[Position{"out", 0, 1}] = true }, func(r Report) Finding { return r.AbortedVisible }},
		{"out-of-order", func(r *Run) {
			r.Output[1], r.Output[2] = r.Output[2], r.Output[1]
		}, func(r Report) Finding { return r.OutOfOrder }},
		{"unexpected", func(r *Run) {
			r.Output = append(r.Output, Output{ID: "zz", Stream: "0", Seq: 9, Position: Position{"out", 0, 3}})
		}, func(r Report) Finding { return r.Unexpected }},
	}
	if rep := Check(cleanRun()); !rep.OK() || rep.Err() != nil {
		t.Fatalf("clean run reported %v", rep)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := cleanRun()
			tt.plant(&run)
			rep := Check(run)
			if got := tt.count(rep).Count; got != 1 {
				t.Fatalf("%s count = %d, want 1 (report: %v)", tt.name, got, rep)
			}
			if rep.OK() || rep.Err() == nil || !strings.Contains(rep.Err().Error(), tt.name+"=1") {
				t.Fatalf("report does not name %s: %v", tt.name, rep.Err())
			}
		})
	}
}

func TestVerifyOrderIsPerStreamAndPartition(t *testing.T) {
	// Interleaved streams, and a later seq of stream "0" in another
	// partition ahead of an earlier one: neither is out of order.
	run := Run{Input: []string{"a0", "a1", "b0", "b1"}}
	run.Output = []Output{
		{ID: "a0", Stream: "0", Seq: 0, Position: Position{"out", 0, 0}},
		{ID: "b0", Stream: "1", Seq: 0, Position: Position{"out", 0, 1}},
		{ID: "a1", Stream: "0", Seq: 1, Position: Position{"out", 1, 0}},
		{ID: "b1", Stream: "1", Seq: 1, Position: Position{"out", 0, 2}},
	}
	if rep := Check(run); !rep.OK() {
		t.Fatalf("reported %v", rep)
	}
}

func TestVerifyExamplesAreBounded(t *testing.T) {
	run := Run{}
	for i := range 100 {
		run.Input = append(run.Input, fmt.Sprint(i))
	}
	rep := Check(run)
	if rep.Lost.Count != 100 || len(rep.Lost.Examples) != maxExamples {
		t.Fatalf("lost = %d with %d examples, want 100 with %d", rep.Lost.Count, len(rep.Lost.Examples), maxExamples)
	}
}

func TestAbortedPositionsFollowsMarkersPerProducer(t *testing.T) {
	txnAttrs := kgo.NewRecordAttrs(kgo.RecordAttrsOpts{Transactional: true})
	ctrlAttrs := kgo.NewRecordAttrs(kgo.RecordAttrsOpts{Transactional: true, Control: true})
	data := func(pid, off int64) *kgo.Record {
		return &kgo.Record{Topic: "out", Partition: 0, Offset: off, ProducerID: pid, Attrs: txnAttrs}
	}
	marker := func(pid, off int64, abort bool) *kgo.Record {
		typ := byte(1)
		if abort {
			typ = 0
		}
		return &kgo.Record{Topic: "out", Partition: 0, Offset: off, ProducerID: pid, Attrs: ctrlAttrs, Key: []byte{0, 0, 0, typ}}
	}
	recs := []*kgo.Record{
		data(1, 0), data(2, 1), data(1, 2),
		marker(1, 3, true),        // producer 1 aborts offsets 0 and 2
		data(2, 4),                //
		marker(2, 5, false),       // producer 2 commits 1 and 4
		data(1, 6),                // producer 1, still open
		{Topic: "out", Offset: 7}, // not transactional
	}
	got := AbortedPositions(recs)
	want := map[Position]bool{{"out", 0, 0}: true, {"out", 0, 2}: true}
	if len(got) != len(want) {
		t.Fatalf("aborted = %v, want %v", got, want)
	}
	for p := range want {
		if !got[p] {
			t.Fatalf("aborted = %v, want %v", got, want)
		}
	}
}
