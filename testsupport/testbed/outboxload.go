package testbed

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/outbox"
)

// OutboxLoad is the hostile writer workload of the outbox tests: concurrent
// connections writing records of shared keys to the outbox, in
// transactions whose ids commit out of order, some rolled back on purpose.
// What committed is recorded in a ledger table in the same transactions,
// so that a commit cut by a database restart is counted as the database
// decided.
type OutboxLoad struct {
	pool  *pgxpool.Pool
	topic string

	mu      sync.Mutex
	aborted []string
	failed  int
	took    time.Duration
	calls   int
}

// NewOutboxLoad creates the load's tables (key_seq, ledger) in pool's
// database; records go to topic.
func NewOutboxLoad(ctx context.Context, pool *pgxpool.Pool, topic string) (*OutboxLoad, error) {
	if _, err := pool.Exec(ctx, `CREATE TABLE key_seq (k text PRIMARY KEY, seq bigint NOT NULL DEFAULT 0);
		CREATE TABLE ledger (id text PRIMARY KEY)`); err != nil {
		return nil, fmt.Errorf("outbox load: %w", err)
	}
	return &OutboxLoad{pool: pool, topic: topic}, nil
}

// Write runs writers connections until n more records committed. A
// transaction writes 1 to 3 of keys, taking each key's next sequence
// number under its row lock (so per key the sequence is the commit
// order), sleeps up to 3 ms before committing (so that across keys ids
// commit out of order), and one in ten rolls back. Values are id|key|seq
// ([verify.DecodeOutputs]' format, the key as the stream). A transaction that
// fails otherwise (the database restarting) is retried after 100 ms.
func (l *OutboxLoad) Write(ctx context.Context, n, writers, keys int) error {
	return l.write(ctx, n, nil, writers, keys)
}

// WriteUntil runs writers connections as Write does until stop is
// closed, however many records that takes. A fault test runs it beside
// Write so that writers are certainly mid-transaction when its database
// fault strikes, however fast the bounded writers finish (50,000 records
// were all written before a relay slow to start under make test's load
// had published the 3,000 the fault waited for: CI, 2026-12-03).
func (l *OutboxLoad) WriteUntil(ctx context.Context, stop <-chan struct{}, writers, keys int) error {
	return l.write(ctx, -1, stop, writers, keys)
}

// write writes n records, or (n < 0) until stop is closed.
func (l *OutboxLoad) write(ctx context.Context, n int, stop <-chan struct{}, writers, keys int) error {
	l.mu.Lock()
	l.calls++
	call := l.calls // ids stay unique over several calls
	l.mu.Unlock()
	var total sync.Mutex
	remaining := n
	take := func(k int) int {
		if n < 0 {
			select {
			case <-stop:
				return 0
			default:
				return k
			}
		}
		total.Lock()
		defer total.Unlock()
		k = min(k, remaining)
		remaining -= k
		return k
	}
	giveBack := func(k int) {
		total.Lock()
		defer total.Unlock()
		remaining += k
	}
	errs := make([]error, writers)
	var wg sync.WaitGroup
	began := time.Now()
	for wr := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(wr), uint64(call)))
			for i := 0; ; i++ {
				abort := rng.IntN(10) == 0
				count := 1 + rng.IntN(3)
				if !abort {
					if count = take(count); count == 0 {
						return
					}
				}
				ids, err := l.transaction(ctx, rng, fmt.Sprintf("c%d-w%d-%d", call, wr, i), count, keys, abort)
				switch {
				case errors.Is(err, errRollback):
					l.mu.Lock()
					l.aborted = append(l.aborted, ids...)
					l.mu.Unlock()
				case ctx.Err() != nil:
					errs[wr] = ctx.Err()
					return
				case err != nil:
					l.mu.Lock()
					l.failed++
					l.mu.Unlock()
					if !abort {
						giveBack(count)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	l.mu.Lock()
	l.took += time.Since(began)
	l.mu.Unlock()
	return errors.Join(errs...)
}

var errRollback = errors.New("roll back on purpose")

func (l *OutboxLoad) transaction(ctx context.Context, rng *rand.Rand, prefix string, count, keys int, abort bool) ([]string, error) {
	picked := map[int]bool{}
	for len(picked) < count {
		picked[rng.IntN(keys)] = true
	}
	ks := make([]int, 0, count)
	for k := range picked {
		ks = append(ks, k)
	}
	slices.Sort(ks) // one lock order: no deadlocks
	pause := time.Duration(rng.IntN(3000)) * time.Microsecond
	var ids []string
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		ids = ids[:0]
		recs := make([]*kgo.Record, 0, count)
		for j, k := range ks {
			key := fmt.Sprintf("k%04d", k)
			var seq int64
			if err := tx.QueryRow(ctx, `INSERT INTO key_seq (k, seq) VALUES ($1, 1)
				ON CONFLICT (k) DO UPDATE SET seq = key_seq.seq + 1 RETURNING seq`, key).Scan(&seq); err != nil {
				return err
			}
			id := fmt.Sprintf("%s-%d", prefix, j)
			ids = append(ids, id)
			recs = append(recs, &kgo.Record{Topic: l.topic, Key: []byte(key), Value: fmt.Appendf(nil, "%s|%s|%d", id, key, seq)})
		}
		if err := outbox.Write(ctx, tx, recs...); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger SELECT unnest($1::text[])`, ids); err != nil {
			return err
		}
		time.Sleep(pause)
		if abort {
			return errRollback
		}
		return nil
	})
	return ids, err
}

// Inputs returns what the verifier needs: the ids the ledger says
// committed, and those rolled back on purpose. It retries for 30 s, as a
// pool's connections fail once each after a database restart.
func (l *OutboxLoad) Inputs(ctx context.Context) (integration.Inputs, error) {
	var ids []string
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; {
		var rows pgx.Rows
		if rows, err = l.pool.Query(ctx, `SELECT id FROM ledger`); err == nil {
			if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			return integration.Inputs{}, fmt.Errorf("outbox load: read the ledger: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return integration.Inputs{Committed: ids, Aborted: slices.Clone(l.aborted)}, nil
}

// Failed counts transactions that failed other than on purpose (cut by a
// database restart), and Took the time the writers spent.
func (l *OutboxLoad) Failed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed
}

// Took is how long the writers ran, summed over every Write and WriteUntil.
func (l *OutboxLoad) Took() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.took
}
