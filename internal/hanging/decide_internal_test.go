package hanging

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
)

func TestJudgeWeighsTheLogThenEndTxnThenTheCoordinator(t *testing.T) {
	const epoch = 7
	commits := evidence{partition: "out[0]", found: true, commit: true}
	aborts := evidence{partition: "out[1]", found: true}
	none := evidence{partition: "out[2]"} // read to the end: no marker yet
	gone := evidence{partition: "out[3]", gone: true}
	joined := evidence{partition: "out[4]", joined: true, joinedEpoch: epoch + 1}
	unreadable := evidence{partition: "out[5]", unreadable: errors.New("NOT_LEADER_OR_FOLLOWER")}
	endTxnCommitted := Record{Known: true, Committed: true}
	endTxnAborted := Record{Known: true}
	unanswered := kadm.DescribedTransaction{State: "Ongoing", ProducerEpoch: epoch + 3} // says nothing of epoch
	committedThen := kadm.DescribedTransaction{State: "CompleteCommit", ProducerEpoch: epoch + 1}

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
		{"records gone beside a marker read", []evidence{gone, aborts}, endTxnCommitted, committedThen, false, true, false, "the marker that closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			commit, known, wait, why := judge(tc.read, tc.rec, tc.coord, epoch)
			if commit != tc.commit || known != tc.known || wait != tc.wait || !strings.Contains(why, tc.why) {
				t.Fatalf("judge = commit %v, known %v, wait %v, %q; want commit %v, known %v, wait %v, naming %q",
					commit, known, wait, why, tc.commit, tc.known, tc.wait, tc.why)
			}
		})
	}
}
