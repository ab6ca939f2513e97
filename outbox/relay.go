package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/loop"
	"github.com/eoskit/eoskit/internal/pgretry"
)

// Relay publishes the outbox's records to Kafka, exactly once and in the
// commit order of the database transactions that wrote them. See the
// package documentation for how, and what it needs.
type Relay struct {
	pool     *pgxpool.Pool
	cfg      *config
	shell    loop.Shell
	prepared bool   // slot, key and transactional id settled; only Run touches it
	system   string // the server's system identifier, as prepare found it
	// undeleted: published rows the relay has yet to delete, kept
	// across sessions and carried in every position record.
	undeleted undeleted
	// dead holds the records found to be refused as their own fault, by
	// row id, until their batch commits; iso, how far the search for
	// them went in the database transaction being isolated. Both outlive
	// a session (one that ended at a transaction timeout, say), so that
	// the next goes on from there. Only Run's goroutine touches them.
	dead map[int64]error
	iso  isolation
	// lonelyFences are when the relay was fenced with no other relay
	// holding its slot (see lonelyFence). Only Run's goroutine touches it.
	lonelyFences []time.Time
	obs          *loop.Observer
}

// NewRelay returns a relay over the outbox in pool's database. Besides
// the pool's connections, the relay opens replication connections of its
// own with the pool's configuration as it stands at each connect: its
// BeforeConnect hook, if set (rotating credentials, say), is called for
// them too. It takes
// [Brokers] (required), [Name], [Slot], [PositionTopic], [TransactionalID],
// [DeadLetter], [WithSemantics], [CommitInterval],
// [MaxRecordsPerCommit], [RetryFor], [StatusInterval], [Logger],
// [WithMetrics] and [ClientOptions].
func NewRelay(pool *pgxpool.Pool, opts ...Option) (*Relay, error) {
	if pool == nil {
		return nil, &eoskit.ConfigError{Package: "outbox", Setting: "pool", Reason: "a pgx pool is required"}
	}
	c := newConfig(opts)
	if err := c.check(); err != nil {
		return nil, err
	}
	// Build (and close) the producer once, so that a pass-through option
	// that contradicts the semantics fails here rather than in Run. Its
	// transactional id is settled by Run; a stand-in does for the check.
	probe := *c
	if probe.txnID == "" {
		probe.txnID = "eoskit-outbox-options-check"
	}
	p, err := probe.newPublisher()
	if err != nil {
		if cerr, ok := errors.AsType[*eoskit.ConfigError](err); ok {
			return nil, &eoskit.ConfigError{Package: "outbox", Setting: "ClientOptions", Semantics: c.semantics.String(),
				Reason: cerr.Setting + ": " + cerr.Reason, Err: err}
		}
		return nil, err
	}
	p.close()
	if c.txnTimeout, err = transactionTimeout(c); err != nil {
		return nil, err
	}
	return &Relay{pool: pool, cfg: c, undeleted: undeleted{ids: map[int64]uint32{}}, dead: map[int64]error{},
		obs: loop.NewObserver("outbox", "", c.metrics)}, nil
}

// transactionTimeout returns the producer's transaction timeout, as the
// pass-through options set it (kgo.TransactionTimeout; franz-go's
// default, 40 s, otherwise), and refuses a kgo.RecordDeliveryTimeout.
func transactionTimeout(c *config) (time.Duration, error) {
	cl, err := kgo.NewClient(c.connOpts()...) // connects to nothing until used
	if err != nil {
		return 0, &eoskit.ConfigError{Package: "outbox", Setting: "ClientOptions", Semantics: c.semantics.String(), Reason: err.Error(), Err: err}
	}
	defer cl.Close()
	if t, _ := cl.OptValue(kgo.RecordDeliveryTimeout).(time.Duration); t > 0 {
		// franz-go measures it from each record's timestamp, which the
		// relay sets to the row's commit time: after an outage the whole
		// backlog would be "timed out" and dead-lettered.
		reason := "kgo.RecordDeliveryTimeout is measured from each record's timestamp, which the relay sets to its row's commit time: after an outage every backlog record would time out and be dead-lettered; bound a relay's retries with outbox.RetryFor"
		return 0, &eoskit.ConfigError{Package: "outbox", Setting: "ClientOptions", Semantics: c.semantics.String(), Reason: reason}
	}
	d, _ := cl.OptValue(kgo.TransactionTimeout).(time.Duration)
	if d <= 0 {
		d = 40 * time.Second
	}
	return d, nil
}

// finalError marks an error retrying can not cure.
type finalError struct{ err error }

func (e finalError) Error() string { return e.err.Error() }
func (e finalError) Unwrap() error { return e.err }

func final(err error) bool {
	var f finalError
	return errors.As(err, &f) || errors.Is(err, eos.ErrFenced) || errors.Is(err, eoskit.ErrInvalidConfig) ||
		errors.Is(err, ErrWALLevel) || errors.Is(err, ErrSchema) || errors.Is(err, ErrNoSlot) || errors.Is(err, ErrTableChanged)
}

// Run relays until ctx is done (then it returns nil, having aborted the
// Kafka transaction in flight, whose records the next run publishes), or
// until a final error: the relay was fenced by another with the same
// transactional id (eos.ErrFenced), the position topic or the
// [DeadLetter] topic does not exist (an *eoskit.ConfigError naming the
// setting: checked when each session starts, and when a produce to it
// fails as UNKNOWN_TOPIC_OR_PARTITION), a record was refused as its own fault
// and no [DeadLetter] topic is set (*[RecordError]), the schema, slot or
// wal_level are wrong, or PostgreSQL or Kafka stayed unreachable for
// [RetryFor] without anything published (the last error, naming where).
// Connection failures, restarts of either side and aborted transactions
// are retried: each retry resumes from the position committed in Kafka.
func (r *Relay) Run(ctx context.Context) error {
	return r.shell.Run(ctx, loop.Spec{
		Pkg: "outbox", Obs: r.obs, Logger: r.cfg.logger,
		Start: func(ctx context.Context) error {
			if err := pgretry.CheckPool(ctx, "outbox", r.pool); err != nil {
				return err
			}
			return loop.ConnectError(ctx, "outbox", r.cfg.connOpts())
		},
		Session: func(ctx, _ context.Context) (progressed bool, err error) {
			if err = r.prepare(ctx); err == nil {
				progressed, err = r.session(ctx)
			}
			_, waited := errors.AsType[*kafkaWaitError](err)
			_, lost := errors.AsType[*slotTakenError](err)
			switch {
			case ctx.Err() != nil:
				return progressed, nil
			case final(err) || waited:
				return progressed, err
			case err == nil:
				err = errors.New("outbox: the replication stream ended")
			}
			// Losing the race for the slot is standing by, not a
			// failure.
			return progressed, &loop.RestartError{Err: err, StandingBy: lost}
		},
		Restarts: loop.Restarts{Base: 100 * time.Millisecond, Limit: 5 * time.Second, WithoutProgress: r.cfg.retryFor},
		Stopped: func(err error) {
			if err != nil && !errors.Is(err, eoskit.ErrRunning) {
				r.cfg.logger.Error("outbox: relay stopped", "slot", r.cfg.slot, "err", err)
			}
		},
	})
}

// session is one connection's life: open it (openSession), publish
// batches until an error (publishAll), close everything it opened. It
// reports whether it published anything, or waited for the slot.
func (r *Relay) session(ctx context.Context) (progressed bool, err error) {
	rs, waited, err := r.openSession(ctx)
	if err != nil {
		return waited, err
	}
	defer rs.close()
	progressed, err = r.publishAll(ctx, rs)
	return waited || progressed, err
}

// slotTakenError: another relay took the slot first, and this one stands
// by again.
type slotTakenError struct{ error }

func (e *slotTakenError) Unwrap() error { return e.error }

// Health returns what the relay shows probes: whether it runs, when it
// last took its slot (LastAssigned), last committed, and the last error
// it rode out. Its Path is "outbox"; it has no partitions or lag.
func (r *Relay) Health() eoskit.Health { return r.obs.Health() }

// isSchemaError reports a table or column missing: a schema no retry
// will mend.
func isSchemaError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703")
}
