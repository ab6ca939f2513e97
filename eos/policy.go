package eos

import (
	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/hanging"
)

// DeadLetter makes the processor write the failing input record to topic
// (same key, value and headers, plus eoskit-error, eoskit-source-topic,
// eoskit-source-partition and eoskit-source-offset headers) inside the same
// transaction that commits its offset, and go on with the next record. The
// record is then either in the dead-letter topic with its offset committed,
// or neither: never lost, never both twice.
//
// A record is dead-lettered when its handler fails or panics, or when one
// of its outputs fails for its own sake (too large, invalid). An output that
// fails for a reason that is no record's fault (a missing topic, a refused
// ACL, a delivery timeout) sends nothing to the dead-letter topic: the
// session restarts with backoff, and Run eventually returns the error. A
// dead letter that cannot be written is tried 4 times with a growing
// backoff (1 s, 2 s, 4 s), then Run returns a *DeadLetterError.
func DeadLetter(topic string) eoskit.ErrorPolicy { return eoskit.DeadLetterTo(topic) }

// HangingPolicy is what an exactly-once [Processor] does when it finds one
// of its own transactions hanging (see [HangingTransactionCheck]). Build
// one with [StopWhenHanging] (the default), [WaitWhenHanging] or
// [RepairHangingTransactions].
type HangingPolicy struct{ kind hanging.Policy }

// StopWhenHanging makes Run return a *HangingTransactionError (wrapping
// [ErrHangingTransaction]) before the processor's next transaction, whose
// records would otherwise join the hanging one in its partition and share
// whatever marker closes it. Nothing is written to the cluster. This is
// the default.
func StopWhenHanging() HangingPolicy { return HangingPolicy{kind: hanging.Stop} }

// WaitWhenHanging makes the processor hold its next transaction, looking
// again every check interval, until the hanging transaction is gone
// (closed by an operator with cmd/eoskit's txn close, say); it reports it
// at Error level once. Nothing is written to the cluster.
func WaitWhenHanging() HangingPolicy { return HangingPolicy{kind: hanging.Wait} }

// RepairHangingTransactions makes the processor close its own hanging
// transactions by writing the missing marker itself (WriteTxnMarkers), with
// the outcome their records already have, as described at
// [HangingTransactionCheck]; one whose outcome it cannot know is reported
// and left, and the processor goes on.
//
// Opt in knowingly. Writing markers is the brokers' job: it needs
// ClusterAction on the cluster, the inter-broker privilege, which managed
// or locked-down clusters never grant an application, and it makes the
// processor a second writer beside the transaction coordinator, deciding an
// outcome from evidence (a wrong one duplicates or loses a transaction's
// records). It exists for clusters that leave hanging transactions behind
// (Apache Kafka 4.1-4.4 with a single broker, KAFKA-20734). Run refuses to
// start with it unless the cluster runs transaction protocol v2
// (transaction.version 2, whose epoch per transaction the outcome rests on)
// and grants ClusterAction.
func RepairHangingTransactions() HangingPolicy { return HangingPolicy{kind: hanging.Repair} }

func (p HangingPolicy) String() string {
	switch p.kind {
	case hanging.Wait:
		return "wait"
	case hanging.Repair:
		return "repair"
	}
	return "stop"
}
