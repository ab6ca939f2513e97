package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/dedup"
	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/verify"
)

var errParse = errors.New("cannot parse the record")

type timeoutError struct{ op string }

func (e *timeoutError) Error() string { return e.op + ": timed out" }

// A classified policy on the real broker and database: a record that
// cannot be parsed is parked at once (its handler runs once, no retry),
// one that times out twice is retried and then applied, one whose handler
// raises a serialization failure is retried by the consumer (never blamed
// on the record, though the policy's fallback is Stop), and a record
// failing otherwise stops Run naming it. Run again with that record
// mended, every record is applied once, in order, or parked once.
func TestClassifiedPolicy(t *testing.T) {
	t.Parallel()
	const n, stopAt = 300, 290 // the special records are all below 200, in batches committed before the stop
	b := newBed(t, 1)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `CREATE TABLE results (seq bigserial PRIMARY KEY, id text NOT NULL, part integer NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	recs := stamped(n)
	inputs := make([]string, n)
	for i, r := range recs {
		inputs[i] = string(r.Value)
	}
	b.produce(t, recs...)

	var mu sync.Mutex
	calls := map[string]int{}
	mended := false
	var stopOffset int64 = -1
	h := func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		id := string(r.Value)
		i, _ := strconv.Atoi(strings.TrimPrefix(id, "m"))
		mu.Lock()
		calls[id]++
		c, fixed := calls[id], mended
		mu.Unlock()
		switch {
		case i == stopAt && !fixed:
			stopOffset = r.Offset
			return errors.New("the disk is full")
		case i < 200 && i%50 == 13:
			return fmt.Errorf("record %s: %w", id, errParse)
		case i < 200 && i%50 == 27 && c <= 2:
			return fmt.Errorf("calling the pricing service: %w", &timeoutError{op: "price " + id})
		case i < 200 && i%50 == 41 && c == 1:
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
			return fmt.Errorf("updating the stock: %w", err)
		}
		_, err := tx.Exec(ctx, `INSERT INTO results (id, part, off) VALUES ($1, $2, $3)`, id, r.Partition, r.Offset)
		return err
	}
	policy := eoskit.Classify(eoskit.Stop(),
		eoskit.When(errParse, dedup.DeadLetter()),
		eoskit.WhenAs[*timeoutError](eoskit.Retry(time.Millisecond, 5)),
	)
	group := integration.UniqueName(t, "g")
	run := func() *run {
		return b.runConsumer(t, b.pool, h, dedup.Group(group), dedup.OnHandlerError(policy), dedup.MaxRecordsPerCommit(50))
	}
	start := time.Now()
	r := run()
	var err error
	select {
	case err = <-r.done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not stop on the record that fails otherwise within a minute")
	}
	t.Logf("Run returned after %s: %v", time.Since(start).Round(time.Millisecond), err)
	var rerr *eoskit.RecordError
	if !errors.As(err, &rerr) || rerr.Offset != stopOffset || rerr.Attempts != 1 || rerr.Err.Error() != "the disk is full" {
		t.Fatalf("Run = %v; want a *RecordError at offset %d after 1 attempt", err, stopOffset)
	}

	mu.Lock()
	mended = true
	mu.Unlock()
	var good, parsed []string
	for i, id := range inputs {
		if i < 200 && i%50 == 13 {
			parsed = append(parsed, id)
		} else {
			good = append(good, id)
		}
	}
	r = run()
	waitFor(t, "every record applied or parked", func() bool {
		r.running(t)
		s := r.c.Stats()
		return s.Applied+s.DeadLetters >= int64(n-stopAt)
	})
	r.stop(t)
	outs, err := verify.ReadRows(ctx, b.pool, "results")
	if err != nil {
		t.Fatal(err)
	}
	if err := verify.Check(verify.Run{Input: good, Output: outs}).Err(); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(ctx, `SELECT convert_from(value, 'UTF8') FROM eoskit_dead_letters WHERE consumer_group = $1 ORDER BY "offset"`, group)
	if err != nil {
		t.Fatal(err)
	}
	values, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(values) != fmt.Sprint(parsed) {
		t.Errorf("parked %v; want the records that cannot be parsed, %v", values, parsed)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range parsed {
		if calls[id] != 1 {
			t.Errorf("%s (cannot be parsed): its handler ran %d times; want once, no retry", id, calls[id])
		}
	}
}
