package offsetstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/offsetstore"
	"github.com/eoskit/eoskit/verify"
)

var errParse = errors.New("cannot parse the record")

type timeoutError struct{ op string }

func (e *timeoutError) Error() string { return e.op + ": timed out" }

// A classified policy on the real broker and database: a record that
// cannot be parsed is parked at once (its handler runs once alone, no
// retry), one that times out twice is retried and then applied, one whose
// handler raises a serialization failure is retried by the runner (never
// blamed on the record, though the policy's fallback is Stop), and the
// first record failing otherwise stops Run naming it. Every record before
// it is applied once, in order, or parked once.
func TestClassifiedPolicy(t *testing.T) {
	t.Parallel()
	const n, stopAt = 300, 260
	b := newBed(t, 1, n)
	index := map[string]int{}
	for i, id := range b.inputs {
		index[id] = i
	}
	var mu sync.Mutex
	calls, alone := map[string]int{}, map[string]int{}
	var stopOffset int64 = -1
	h := func(ctx context.Context, tx pgx.Tx, recs []*kgo.Record) error {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range recs {
			id := string(r.Key)
			calls[id]++
			if len(recs) == 1 {
				alone[id]++
			}
			switch i := index[id]; {
			case i == stopAt:
				stopOffset = r.Offset
				return errors.New("the disk is full")
			case i%50 == 13:
				return fmt.Errorf("record %s: %w", id, errParse)
			case i%50 == 27 && calls[id] <= 2:
				return fmt.Errorf("calling the pricing service: %w", &timeoutError{op: "price " + id})
			case i%50 == 41 && calls[id] == 1:
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
				return fmt.Errorf("updating the stock: %w", err)
			}
		}
		return load(nil)(ctx, tx, recs)
	}
	policy := eoskit.Classify(eoskit.Stop(),
		eoskit.When(errParse, offsetstore.DeadLetter()),
		eoskit.WhenAs[*timeoutError](eoskit.Retry(time.Millisecond, 5)),
	)
	start := time.Now()
	err := b.start(t, h, offsetstore.OnHandlerError(policy)).wait(t, time.Minute)
	t.Logf("Run returned after %s: %v", time.Since(start).Round(time.Millisecond), err)

	var rerr *eoskit.RecordError
	if !errors.As(err, &rerr) || rerr.Offset != stopOffset || rerr.Attempts != 1 || rerr.Err.Error() != "the disk is full" {
		t.Fatalf("Run = %v; want a *RecordError at offset %d after 1 attempt", err, stopOffset)
	}
	var good, parsed []string
	for _, id := range b.inputs[:stopAt] {
		if index[id]%50 == 13 {
			parsed = append(parsed, id)
		} else {
			good = append(good, id)
		}
	}
	outs, err := verify.ReadRows(context.Background(), b.pool, "results")
	if err != nil {
		t.Fatal(err)
	}
	if err := verify.Check(verify.Run{Input: good, Output: outs}).Err(); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(context.Background(), `SELECT convert_from(key, 'UTF8') FROM eoskit_dead_letters WHERE consumer_group = $1 ORDER BY "offset"`, b.group)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(keys) != fmt.Sprint(parsed) {
		t.Errorf("parked %v; want the records that cannot be parsed, %v", keys, parsed)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range parsed {
		if alone[id] != 1 {
			t.Errorf("%s (cannot be parsed): its handler ran %d times alone; want once, no retry", id, alone[id])
		}
	}
	// A Retry rolls the whole batch back and runs it again after its
	// pause (no lock is held through it), so a record may be handled
	// again after its success, when a later one is retried; it is
	// committed once (checked above).
	for _, id := range good {
		if i := index[id]; i%50 == 27 && calls[id] < 3 || i%50 == 41 && calls[id] < 2 {
			t.Errorf("%s: handler called %d times; want the failures and a success at least", id, calls[id])
		}
	}
}
