package eos

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
)

func TestTimedOutAloneTellsATimeoutFromANewOwner(t *testing.T) {
	const pid, epoch = 4000, 7
	for _, c := range []struct {
		name  string
		coord kadm.DescribedTransaction
		want  bool
	}{
		{"the coordinator aborted it at its timeout", kadm.DescribedTransaction{ProducerID: pid, ProducerEpoch: epoch + 1, State: "CompleteAbort"}, true},
		{"the coordinator is writing the abort markers", kadm.DescribedTransaction{ProducerID: pid, ProducerEpoch: epoch + 1, State: "PrepareAbort"}, true},
		{"a newer instance registered the id", kadm.DescribedTransaction{ProducerID: pid, ProducerEpoch: epoch + 2, State: "Empty"}, false},
		{"a newer instance is in a transaction", kadm.DescribedTransaction{ProducerID: pid, ProducerEpoch: epoch + 2, State: "Ongoing"}, false},
		{"a newer instance ended transactions since (v2 bumps per transaction)", kadm.DescribedTransaction{ProducerID: pid, ProducerEpoch: epoch + 9, State: "CompleteAbort"}, false},
		{"the id moved to another producer id (epoch exhausted)", kadm.DescribedTransaction{ProducerID: pid + 1, ProducerEpoch: 0, State: "Empty"}, false},
		{"committed at the next epoch: not a timeout", kadm.DescribedTransaction{ProducerID: pid, ProducerEpoch: epoch + 1, State: "CompleteCommit"}, false},
		{"still this epoch: the error was not the coordinator's bump", kadm.DescribedTransaction{ProducerID: pid, ProducerEpoch: epoch, State: "Ongoing"}, false},
	} {
		if got := timedOutAlone(c.coord, pid, epoch); got != c.want {
			t.Errorf("%s: timedOutAlone = %v, want %v", c.name, got, c.want)
		}
	}
}
