package eoslab

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/outbox"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/patterns/outboxrelay"
)

// exactlyOnceOutbox is the pattern outboxrelay: the database writes the
// reports into the outbox, the relay publishes them.
func exactlyOnceOutbox() Pattern {
	return Pattern{
		Name:          "exactly-once outbox relay",
		Guarantee:     "outbox rows from the log in commit order; records and position in one Kafka transaction",
		NeedsDatabase: true,
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			return l.outboxPipeline(ctx, p, eos.ExactlyOnce)
		},
	}
}

// atLeastOnceOutbox is the control, the relay most outboxes have: publish,
// wait for the acknowledgement, then record the position.
func atLeastOnceOutbox() Pattern {
	return Pattern{
		Name:          "at-least-once outbox relay",
		Guarantee:     "acknowledged by Kafka, then the position recorded",
		NeedsDatabase: true,
		Control:       true,
		run: func(ctx context.Context, l *Lab, p Pattern) (result, error) {
			return l.outboxPipeline(ctx, p, eos.AtLeastOnce)
		},
	}
}

// outboxPipeline writes the reports into the outbox from one connection
// per region (so each region commits in report order), relays them with
// the pattern outboxrelay, its semantics set to sem, crashes the relay twice at the worst
// moment for it (at-least-once: Kafka acknowledged the batch; exactly-once:
// its transaction is open; the slot not yet told either way), and reads
// the topic.
func (l *Lab) outboxPipeline(ctx context.Context, p Pattern, sem eos.Semantics) (result, error) {
	adm, closeAdm, err := l.admin()
	if err != nil {
		return result{}, err
	}
	defer closeAdm()
	out := runName(p)
	positions := out + "-positions"
	if err := l.newTopics(ctx, adm, out, positions); err != nil {
		return result{}, err
	}
	defer func() { _, _ = adm.DeleteTopics(context.WithoutCancel(ctx), out, positions) }()

	// The run's own slot: created after the migration and dropped at the
	// end, so that no earlier run's records come along, and no slot is
	// left holding the server's log.
	if err := outboxrelay.Migrate(ctx, outboxrelay.Config{Pool: l.Pool}); err != nil {
		return result{}, err
	}
	slot, err := outbox.DefaultSlot(ctx, l.Pool)
	if err != nil {
		return result{}, err
	}
	if err := dropSlot(ctx, l.Pool, slot, l.StepTimeout); err != nil {
		return result{}, err
	}
	if err := outbox.CreateSlot(ctx, l.Pool, slot); err != nil {
		return result{}, err
	}
	defer func() { _ = dropSlot(context.WithoutCancel(ctx), l.Pool, slot, 10*time.Second) }()

	crash := &crashPoint{}
	cfg := l.Pool.Config()
	cfg.ConnConfig.Tracer = crash
	relayPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return result{}, err
	}
	defer relayPool.Close()

	l.progress(p, "writers: one connection per region, committing reports into the outbox")
	wrote := make(chan error, 1)
	go func() { wrote <- l.writeOutbox(ctx, out) }()

	start := func() (stop func() error, err error) {
		r, err := outboxrelay.New(outboxrelay.Config{Pool: relayPool, Brokers: l.Brokers, PositionTopic: positions, Logger: l.Logger,
			Options: []outbox.Option{outbox.WithSemantics(sem), outbox.CommitInterval(20 * time.Millisecond), outbox.MaxRecordsPerCommit(100)}})
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		return func() error {
			cancel()
			crash.release()
			select {
			case err := <-done:
				return err
			case <-time.After(l.StepTimeout):
				return fmt.Errorf("%w: the relay did not stop", ErrStalled)
			}
		}, nil
	}
	committed := func() (int64, error) {
		ends, err := adm.ListCommittedOffsets(ctx, out)
		if err != nil {
			return 0, err
		}
		var n int64
		ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
		return n, nil
	}
	wait := func(step string, cond func() (bool, error)) error {
		l.progress(p, step)
		deadline := time.Now().Add(l.StepTimeout)
		for {
			ok, err := cond()
			if ok {
				return nil
			}
			if time.Now().After(deadline) {
				return &StepError{Pattern: p.Name, Step: step, Waited: l.StepTimeout, Total: int64(len(l.Reports)), Err: errors.Join(ErrStalled, err)}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}

	var faults []string
	for _, at := range []float64{0.3, 0.65} {
		// Armed before the relay starts, the crash point itself catches
		// the deletion that brings the rows deleted to at% of the
		// reports: a lab that polled for the relay's progress and
		// armed only then could find the relay already through the
		// rest, and wait for a deletion that never came.
		caught := crash.arm(int(at * float64(len(l.Reports))))
		stop, err := start()
		if err != nil {
			return result{}, err
		}
		if err := wait(fmt.Sprintf("relay: publishing until %.0f%%, caught deleting a published batch's rows, before the slot is told", at*100), func() (bool, error) {
			select {
			case <-caught:
				return true, nil
			default:
				return false, nil
			}
		}); err != nil {
			_ = stop()
			return result{}, err
		}
		if err := stop(); err != nil {
			return result{}, fmt.Errorf("relay crash at %.0f%%: %w", at*100, err)
		}
		state := "its Kafka transaction open"
		if sem == eos.AtLeastOnce {
			state = "its batch acknowledged by Kafka"
		}
		faults = append(faults, fmt.Sprintf("relay crashed at %.0f%%, %s, the slot not yet told", at*100, state))
	}
	if err := <-wrote; err != nil {
		return result{}, err
	}
	stop, err := start()
	if err != nil {
		return result{}, err
	}
	var res result
	err = wait("relay: publishing the rest", func() (bool, error) {
		n, err := committed()
		if err != nil || n < int64(len(l.Reports)) {
			return false, err
		}
		res, err = l.readKafkaOutput(ctx, out, faults)
		// Every report, not as many outputs as reports: duplicates
		// would reach that count early.
		seen := map[string]bool{}
		for _, o := range res.outputs {
			seen[o.ID] = true
		}
		return err == nil && len(seen) >= len(l.Reports), err
	})
	if stopErr := stop(); err == nil {
		err = stopErr
	}
	return res, err
}

// writeOutbox writes the reports into the outbox, one connection per
// region, each region's in order, in transactions of up to 4 reports.
func (l *Lab) writeOutbox(ctx context.Context, topic string) error {
	var wg sync.WaitGroup
	errs := make([]error, len(regions))
	for i, region := range regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var batch []dashboard.Report
			n := 0
			flush := func() error {
				err := pgx.BeginFunc(ctx, l.Pool, func(tx pgx.Tx) error { return outboxrelay.Submit(ctx, tx, topic, batch...) })
				batch = batch[:0]
				return err
			}
			for _, r := range l.Reports {
				if r.Region != region {
					continue
				}
				batch = append(batch, r)
				if n++; len(batch) >= 1+n%4 {
					if errs[i] = flush(); errs[i] != nil {
						return
					}
				}
			}
			if len(batch) > 0 {
				errs[i] = flush()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// crashPoint is a pgx tracer on the relay's pool: once armed, the
// relay's first deletion of published rows (which comes after Kafka
// acknowledged the batch, and before the relay commits or tells the slot)
// that brings the rows its deletions named to a given number blocks
// until released, so that the lab can stop the relay right there: a
// crash at the worst moment for an at-least-once relay.
type crashPoint struct {
	mu      sync.Mutex
	deleted map[int64]bool // the rows the relay's deletions named, every session's
	after   int
	caught  chan struct{}
	held    chan struct{}
}

// arm catches the first deletion that brings the rows named to after or
// more (the one that crosses it, so that a last batch can be caught).
func (c *crashPoint) arm(after int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.deleted == nil {
		c.deleted = map[int64]bool{}
	}
	c.after = after
	c.caught, c.held = make(chan struct{}), make(chan struct{})
	return c.caught
}

func (c *crashPoint) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held != nil {
		close(c.held)
		c.caught, c.held = nil, nil
	}
}

func (c *crashPoint) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(data.SQL, "DELETE FROM "+pgx.Identifier{outbox.Table}.Sanitize()+" ") { // the relay deletes in a WITH: ... RETURNING
		return ctx
	}
	c.mu.Lock()
	if len(data.Args) > 0 {
		if ids, ok := data.Args[0].([]int64); ok {
			for _, id := range ids {
				c.deleted[id] = true
			}
		}
	}
	var caught, held chan struct{}
	if c.caught != nil && len(c.deleted) >= c.after {
		caught, held = c.caught, c.held
		c.caught = nil // one catch per arming
	}
	c.mu.Unlock()
	if caught == nil {
		return ctx
	}
	close(caught)
	<-held
	return ctx
}

func (c *crashPoint) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
