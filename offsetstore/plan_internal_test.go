package offsetstore

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

// planBatch keeps what is not committed yet, per partition where the
// records end, where the database must stand and the first offset; its
// partitions sorted; and refuses a batch with a record of a partition the
// runner no longer owns, naming each such partition once.
func TestPlanBatch(t *testing.T) {
	rec := func(topic string, p int32, off int64) *kgo.Record {
		return &kgo.Record{Topic: topic, Partition: p, Offset: off}
	}
	a0, a1, b0 := topicPartition{"a", 0}, topicPartition{"a", 1}, topicPartition{"b", 0}
	id := pgtype.UUID{Bytes: [16]byte{1}, Valid: true}
	positions := map[topicPartition]int64{a0: 10, a1: noRow, b0: 5}
	recs := []*kgo.Record{rec("b", 0, 4), rec("b", 0, 5), rec("a", 1, 0), rec("a", 0, 10), rec("a", 0, 11), rec("b", 0, 6)}
	pl, stale := planBatch(recs, positions, map[topicPartition]pgtype.UUID{a1: id}, map[string]pgtype.UUID{"a": id})
	if stale != nil {
		t.Fatalf("stale %v, want none", stale)
	}
	if got := fmt.Sprint(pl.parts); got != "[{a 0} {a 1} {b 0}]" {
		t.Errorf("parts %s, want sorted by topic and partition", got)
	}
	if len(pl.fresh) != 5 || pl.fresh[0].Offset != 5 {
		t.Errorf("fresh %d records from offset %d, want 5 (b[0]@4 is committed already)", len(pl.fresh), pl.fresh[0].Offset)
	}
	want := map[topicPartition][3]int64{a0: {12, 10, 10}, a1: {1, noRow, 0}, b0: {7, 5, 5}}
	for tp, w := range want {
		if got := [3]int64{pl.next[tp], pl.expected[tp], pl.first[tp]}; got != w {
			t.Errorf("%v: next, expected, first %v, want %v", tp, got, w)
		}
	}
	if pl.oldRows[a1] != id || len(pl.oldRows) != 1 || pl.ids["a"] != id || pl.ids["b"].Valid {
		t.Errorf("oldRows %v, ids %v: want a[1]'s old row and topic a's ID only", pl.oldRows, pl.ids)
	}
	_, stale = planBatch(append(recs, rec("c", 0, 1), rec("c", 0, 2)), positions, nil, nil)
	if stale == nil || fmt.Sprint(stale.parts) != "[{c 0}]" {
		t.Errorf("a partition not owned: stale %v, want c[0] named once", stale)
	}
}

// abortReason labels a rolled-back attempt by whose doing it was.
func TestAbortReason(t *testing.T) {
	for _, c := range []struct {
		err    error
		reason string
		failed bool
	}{
		{&staleError{}, "stale", false},
		{&retryError{halt: &halt{rec: &kgo.Record{}}}, "handler-error", false},
		{&stopError{err: &eoskit.RecordError{Err: io.EOF}}, "handler-error", false},
		{fmt.Errorf("x: %w", ErrRejectedOutsideBatch), "handler-error", false},
		{eoskit.ErrRunnerOwnsTx, "handler-error", false},
		{&handlerError{err: io.EOF}, "handler-error", false},
		{&handlerError{err: io.EOF, transient: true}, "database-error", true},
		{errors.New("connection reset"), "database-error", true},
	} {
		if reason, failed := abortReason(c.err); reason != c.reason || failed != c.failed {
			t.Errorf("%T %v: %q %v, want %q %v", c.err, c.err, reason, failed, c.reason, c.failed)
		}
	}
}
