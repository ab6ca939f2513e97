package hanging

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
)

func TestJudgeWeighsTheLogThenEndTxnThenTheCoordinator(t *testing.T) {
	const id, epoch = 4000, 7
	commits := evidence{partition: "out[0]", found: true, commit: true}
	aborts := evidence{partition: "out[1]", found: true}
	none := evidence{partition: "out[2]"} // read to the end: no marker yet
	gone := evidence{partition: "out[3]", gone: true}
	joined := evidence{partition: "out[4]", joined: true, joinedEpoch: epoch + 1}
	unreadable := evidence{partition: "out[5]", unreadable: errors.New("NOT_LEADER_OR_FOLLOWER")}
	endTxnCommitted := Record{Known: true, Committed: true}
	endTxnAborted := Record{Known: true}
	unanswered := kadm.DescribedTransaction{State: "Ongoing", ProducerID: id, ProducerEpoch: epoch + 3} // says nothing of epoch
	committedThen := kadm.DescribedTransaction{State: "CompleteCommit", ProducerID: id, ProducerEpoch: epoch + 1}
	// The coordinator gave the transactional id a new producer id (epochs
	// run out): its state at epoch+1 is the new id's, not this one's.
	movedOn := kadm.DescribedTransaction{State: "CompleteCommit", ProducerID: id + 1, ProducerEpoch: epoch + 1}

	for _, tc := range []struct {
		name                string
		read                []evidence
		rec                 Record
		coord               kadm.DescribedTransaction
		commit, known, wait bool
		why                 string // a part of the evidence named
	}{
		{"a marker outranks EndTxn and the coordinator", []evidence{none, aborts}, endTxnCommitted, committedThen, false, true, false, "the marker that closed"},
		{"markers that agree", []evidence{commits, commits}, endTxnAborted, unanswered, true, true, false, "the marker that closed"},
		{"markers that disagree: torn, unknown", []evidence{commits, aborts}, endTxnCommitted, committedThen, false, false, false, "torn"},
		{"no marker: EndTxn's answer", []evidence{none}, endTxnCommitted, unanswered, true, true, false, "EndTxn"},
		{"no marker: EndTxn's answer, the coordinator agreeing", []evidence{none}, endTxnCommitted, committedThen, true, true, false, "EndTxn"},
		{"no marker, EndTxn and the coordinator disagree: unknown", []evidence{none}, endTxnAborted, committedThen, false, false, false, "disagree"},
		{"no marker, no EndTxn answer: the coordinator", []evidence{none}, Record{}, committedThen, true, true, false, "coordinator's state"},
		{"nothing known", []evidence{none}, Record{}, unanswered, false, false, false, "none: the coordinator is Ongoing"},
		{"a partition joined by a later transaction waits, whatever else is known", []evidence{commits, joined}, endTxnCommitted, committedThen, false, false, true, "joined in out[4]"},
		{"an unreadable partition waits", []evidence{commits, unreadable}, endTxnCommitted, committedThen, false, false, true, "could not be read"},
		// Records gone say nothing: a later transaction's abort may have
		// closed them, so EndTxn's commit is not trusted.
		{"records gone are not EndTxn's answer", []evidence{gone}, endTxnCommitted, unanswered, false, false, false, "out[3] are gone"},
		{"records gone leave it to the coordinator", []evidence{gone, none}, endTxnAborted, committedThen, true, true, false, "coordinator's state"},
		{"a producer id the coordinator moved past: the marker", []evidence{aborts}, endTxnCommitted, movedOn, false, true, false, "the marker that closed"},
		{"a producer id the coordinator moved past: EndTxn's answer", []evidence{none}, endTxnAborted, movedOn, false, true, false, "EndTxn"},
		{"a producer id the coordinator moved past, nothing else: unknown", []evidence{none}, Record{}, movedOn, false, false, false, "moved on to producer id 4001"},
		{"records gone beside a marker read", []evidence{gone, aborts}, endTxnCommitted, committedThen, false, true, false, "the marker that closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			commit, known, wait, why := judge(tc.read, tc.rec, tc.coord, id, epoch)
			if commit != tc.commit || known != tc.known || wait != tc.wait || !strings.Contains(why, tc.why) {
				t.Fatalf("judge = commit %v, known %v, wait %v, %q; want commit %v, known %v, wait %v, naming %q",
					commit, known, wait, why, tc.commit, tc.known, tc.wait, tc.why)
			}
		})
	}
}

// The processor's producer ids are remembered past the outcomes kept (a
// producer id lasts 32,767 transactions under protocol v2, the outcomes
// 256): the sweep then takes a hang of an old one for its own after the
// coordinator moved the transactional id to a new producer id. Only the
// latest keptIDs are.
func TestOutcomesKnowTheProducerIDsUsed(t *testing.T) {
	var o txnOutcomes
	if o.used(4000) {
		t.Fatal("an id used before anything was recorded")
	}
	o.record(4000, 32766, Record{Known: true, Committed: true})
	o.record(4001, 0, Record{Known: true, Committed: true})
	if !o.used(4000) || !o.used(4001) || o.used(4002) {
		t.Fatalf("used: 4000 %v, 4001 %v, 4002 %v; want the two recorded", o.used(4000), o.used(4001), o.used(4002))
	}
	for i := range 2 * keptOutcomes {
		o.record(4001, int16(i+1), Record{})
	}
	if _, kept := o.lookup(4000, 32766); kept || !o.used(4000) {
		t.Fatalf("after %d more transactions: 4000's outcome kept %v, 4000 used %v; want its outcome gone and the id remembered", 2*keptOutcomes, kept, o.used(4000))
	}
	for id := int64(4002); id < 4002+keptIDs; id++ {
		o.record(id, 0, Record{})
	}
	if o.used(4000) || !o.used(4001+keptIDs) {
		t.Fatalf("after %d more ids: 4000 used %v, %d used %v; want only the latest %d", keptIDs, o.used(4000), 4001+keptIDs, o.used(4001+keptIDs), keptIDs)
	}
}
