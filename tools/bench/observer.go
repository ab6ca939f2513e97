package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// observer sees results become visible: on the output topic through a
// read_committed reader, or in the results table through a poller, which
// sees a row once its transaction committed.
type observer struct {
	ctx    context.Context
	e      *env
	reader *kgo.Client // nil: poll the results table
	// seq is the row up to which every row was seen; seen holds the rows
	// after it already seen, and blocked when a missing row began to hold
	// seq back.
	seq     int64
	seen    map[int64]bool
	blocked time.Time
}

func newObserver(ctx context.Context, e *env, output bool) *observer {
	o := &observer{ctx: ctx, e: e, seen: map[int64]bool{}}
	if output {
		cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumeTopics(e.out),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			fail(err)
		}
		o.reader = cl
	}
	return o
}

// collect returns, for n results, how long after its input was produced
// each became visible.
func (o *observer) collect(n int, timeout time.Duration) ([]time.Duration, error) {
	if o.reader != nil {
		defer o.reader.Close()
	}
	lat := make([]time.Duration, 0, n)
	deadline := time.Now().Add(timeout)
	for len(lat) < n {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d results within %s", len(lat), n, timeout)
		}
		var err error
		if o.reader != nil {
			lat, err = o.pollTopic(lat)
		} else {
			lat, err = o.pollTable(lat)
		}
		if err != nil {
			return nil, err
		}
	}
	return lat, nil
}

func (o *observer) pollTopic(lat []time.Duration) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(o.ctx, time.Second)
	defer cancel()
	f := o.reader.PollFetches(ctx)
	now := time.Now()
	f.EachRecord(func(r *kgo.Record) { lat = append(lat, now.Sub(r.Timestamp)) })
	return lat, o.ctx.Err()
}

// pollTable reads the rows committed since the last poll. Rows get their
// seq when inserted; a runner with concurrent transactions (one per
// partition) commits them out of seq order, so it reads again from the
// first row it has not seen, and skips the ones it has. A missing row
// that stays missing for 2 s (its transaction rolled back: a sequence
// value is never given back) no longer holds it back.
func (o *observer) pollTable(lat []time.Duration) ([]time.Duration, error) {
	// A row in the query's snapshot was visible when the query began.
	now := time.Now()
	rows, err := o.e.pool.Query(o.ctx, `SELECT seq, produced_ns FROM `+rowsTable+` WHERE seq > $1 ORDER BY seq`, o.seq)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var produced int64
		var seq int64
		if err := rows.Scan(&seq, &produced); err != nil {
			return nil, err
		}
		if !o.seen[seq] {
			o.seen[seq] = true
			lat = append(lat, now.Sub(time.Unix(0, produced)))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	o.advance(now)
	time.Sleep(2 * time.Millisecond)
	return lat, nil
}

// advance moves seq past the rows seen without a gap, and past a gap that
// lasted 2 s.
func (o *observer) advance(now time.Time) {
	for {
		for o.seen[o.seq+1] {
			delete(o.seen, o.seq+1)
			o.seq++
		}
		if len(o.seen) == 0 {
			o.blocked = time.Time{}
			return
		}
		if o.blocked.IsZero() {
			o.blocked = now
		}
		if now.Sub(o.blocked) < 2*time.Second {
			return
		}
		o.seq = slices.Min(slices.Collect(maps.Keys(o.seen))) - 1
		o.blocked = time.Time{}
	}
}
