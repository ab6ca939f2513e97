package txnscan

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
)

// The broker places a group's offsets by Java's String.hashCode; a wrong
// hash would make the hanging-transaction check look in the wrong
// partition. The expected values are what Java computes.
func TestJavaStringHashMatchesJava(t *testing.T) {
	for _, c := range []struct {
		s    string
		want int32
	}{
		{"", 0},
		{"test", 3556498},
		{"hello", 99162322},
		{"é", 233},
		{"😀", 1772899}, // a surrogate pair: two UTF-16 units
		{"a-much-longer-consumer-group-name", 1408396288},
		{"polygenelubricants", -2147483648}, // overflows to the minimum int32
	} {
		if got := JavaStringHash(c.s); got != c.want {
			t.Errorf("JavaStringHash(%q) = %d, want %d", c.s, got, c.want)
		}
	}
	// Kafka places a group by Utils.abs(hash) % partitions
	// (GroupCoordinatorService.partitionFor; a transactional id's
	// coordinator is found the same way): Math.abs, with Integer.MIN_VALUE
	// mapped to 0. Masking the sign bit (hash & 0x7fffffff) differs for
	// every negative hash, about half of all names. The expected values
	// are what Java computes on the broker's default of 50 partitions.
	for name, want := range map[string]int32{
		"my-group":                          12, // hash -1906497762: masking gives 36
		"eoskit-hang-neg":                   37, // hash -1843343787: masking gives 11
		"eos-txn-1":                         0,  // hash -1603024950: masking gives 48
		"eoskit-group-α":                    27, // hash -320319677, a non-ASCII name
		"a-much-longer-consumer-group-name": 38, // a positive hash: both agree
		"orders-service":                    17,
		"polygenelubricants":                0, // Integer.MIN_VALUE: Utils.abs gives 0
	} {
		if got := GroupPartition(name, 50); got != want {
			t.Errorf("GroupPartition(%q, 50) = %d, want %d", name, got, want)
		}
	}
}

// A later look shows a transaction moved on when its epoch or start offset
// changed, or its producer wrote since: a live transaction whose record
// times are old, or a protocol v1 producer's next transaction joining the
// open one, is not taken for a hanging one.
func TestChangedTellsALiveTransactionFromAStillOne(t *testing.T) {
	at := func(epoch int16, start int64, seq int32, ts int64) kadm.DescribedProducer {
		return kadm.DescribedProducer{ProducerEpoch: epoch, CurrentTxnStartOffset: start, LastSequence: seq, LastTimestamp: ts}
	}
	first := at(0, 10, 4, 1000)
	for _, c := range []struct {
		name      string
		id        string
		later     kadm.DescribedProducer
		wantMoved bool
	}{
		{"unchanged, no id", "", at(0, 10, 4, 1000), false},
		{"wrote since, no id", "", at(0, 10, 5, 1500), true},
		{"wrote since with the same time, no id", "", at(0, 10, 5, 1000), true},
		{"same sequence, a new time, no id", "", at(0, 10, 4, 1001), true},
		{"a new transaction", "", at(0, 20, 9, 2000), true},
		{"a new epoch", "app-0", at(1, 10, 4, 1000), true},
		{"wrote since, with an id (a v1 producer joined it with its next transaction)", "app-0", at(0, 10, 5, 1000), true},
		{"unchanged, with an id", "app-0", at(0, 10, 4, 1000), false},
	} {
		h := Hang{DescribedProducer: first, TransactionalID: c.id}
		if got := changed(h, c.later); got != c.wantMoved {
			t.Errorf("%s: changed = %v, want %v", c.name, got, c.wantMoved)
		}
	}
}
