package producerresume_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/producerresume"
)

// A send whose context ends while its produce request is on the wire, and
// which the broker then writes, is not resent: the idempotent client does
// not fail a record it has sent until it knows the outcome, so Send waits
// for it rather than read the previous report as the last and write this
// one again. Issue 47 item 7 named this a possible defect: the first case
// passed on 7d16fbd too, so the default Produce was not affected. The
// second case is the negative control: a Produce that returns when its
// context ends, before the outcome is known (what Config.Produce's doc
// forbids), writes the report twice, and the test sees it.
func TestASendWhoseContextEndsInFlightIsNotResent(t *testing.T) {
	for _, tc := range []struct {
		name     string
		produce  func(cl *kgo.Client) func(context.Context, *kgo.Record) error
		want     []string
		wantDups bool
	}{
		{name: "the default Produce", want: []string{"n1", "n2"}},
		{name: "a Produce that returns at its context's end (negative control)", wantDups: true,
			produce: func(cl *kgo.Client) func(context.Context, *kgo.Record) error {
				return func(ctx context.Context, r *kgo.Record) error {
					done := make(chan error, 1)
					cl.Produce(context.WithoutCancel(ctx), r, func(_ *kgo.Record, err error) { done <- err })
					select {
					case err := <-done:
						return err
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := sendWithAHeldRequest(t, tc.produce)
			switch {
			case tc.wantDups && len(ids) <= 2:
				t.Fatalf("the partition holds %v: the negative control wrote no copy, so the test cannot tell one", ids)
			case !tc.wantDups && !slices.Equal(ids, tc.want):
				t.Fatalf("the partition holds %v, want %v", ids, tc.want)
			}
		})
	}
}

// sendWithAHeldRequest sends n1, then n2 with a 1 s context while the
// broker holds n2's produce request for 3 s before writing it, then sends
// n2 again if Send failed (as a caller does after a crash), and returns the
// report ids the partition holds.
func sendWithAHeldRequest(t *testing.T, produce func(*kgo.Client) func(context.Context, *kgo.Record) error) []string {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "case-reports"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	brokers := c.ListenAddrs()
	cfg := producerresume.Config{Brokers: brokers, Topic: "case-reports"}
	if produce != nil {
		own, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		defer own.Close()
		cfg.Produce = produce(own)
	}
	p, err := producerresume.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Send(ctx, dashboard.Report{ID: "n1", Region: "north", Cases: 1}); err != nil {
		t.Fatal(err)
	}

	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.SleepControl(func() { time.Sleep(3 * time.Second) })
		return nil, nil, false
	})
	sendCtx, sendCancel := context.WithTimeout(ctx, time.Second)
	defer sendCancel()
	start := time.Now()
	err = p.Send(sendCtx, dashboard.Report{ID: "n2", Region: "north", Cases: 2})
	t.Logf("Send returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Send: %v", err)
	}
	if err != nil {
		if err := p.Send(ctx, dashboard.Report{ID: "n2", Region: "north", Cases: 2}); err != nil {
			t.Fatal(err)
		}
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("case-reports"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var ids []string
	readCtx, readCancel := context.WithTimeout(ctx, 5*time.Second)
	defer readCancel()
	for readCtx.Err() == nil { // until 5 s pass: a late copy shows too
		cl.PollFetches(readCtx).EachRecord(func(r *kgo.Record) {
			rep, err := dashboard.Parse(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, rep.ID)
		})
	}
	return ids
}

// A partition whose records retention deleted gives Last no record to read
// how far the source got: it says so at once, rather than wait 30 s for a
// record that is not there and fail with a deadline at every start.
func TestLastSaysSoWhenRetentionDeletedEveryRecord(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "case-reports"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := producerresume.New(producerresume.Config{Brokers: c.ListenAddrs(), Topic: "case-reports"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Send(ctx, dashboard.Report{ID: "n1", Region: "north", Cases: 1}); err != nil {
		t.Fatal(err)
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	deleted, err := kadm.NewClient(adm).DeleteRecords(ctx, kadm.Offsets{"case-reports": {0: {At: 1}}})
	if err == nil {
		err = deleted.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := p.Last(ctx); !errors.Is(err, producerresume.ErrLastRecordDeleted) || time.Since(start) > 10*time.Second {
		t.Fatalf("Last after retention deleted every record: %v after %v, want ErrLastRecordDeleted at once", err, time.Since(start))
	}
}
