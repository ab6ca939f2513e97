package main

import (
	"context"
	"fmt"
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
	seq    int64       // last row seen in the table
}

func newObserver(ctx context.Context, e *env, output bool) *observer {
	o := &observer{ctx: ctx, e: e}
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
// seq when inserted, and every variant commits its transactions one after
// another, so rows become visible in seq order and none is skipped.
func (o *observer) pollTable(lat []time.Duration) ([]time.Duration, error) {
	// A row in the query's snapshot was visible when the query began.
	now := time.Now()
	rows, err := o.e.pool.Query(o.ctx, `SELECT seq, produced_ns FROM `+rowsTable+` WHERE seq > $1 ORDER BY seq`, o.seq)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var produced int64
		if err := rows.Scan(&o.seq, &produced); err != nil {
			return nil, err
		}
		lat = append(lat, now.Sub(time.Unix(0, produced)))
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Millisecond)
	return lat, nil
}
