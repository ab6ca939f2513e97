package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/internal/authz"
	"github.com/eoskit/eoskit/internal/loop"
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
	log := r.cfg.logger.With("slot", r.cfg.slot)
	return r.shell.Run(ctx, loop.Spec{
		Pkg: "outbox", Obs: r.obs, Logger: log,
		Start: func(ctx context.Context) error { return loop.ConnectError(ctx, "outbox", r.cfg.connOpts()) },
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
				log.Error("outbox: relay stopped", "err", err)
			}
		},
	})
}

// kafkaWaitError ends Run: the relay waited for Kafka to take a batch for
// RetryFor, which bounds that wait as it bounds the retries.
type kafkaWaitError struct{ err error }

func (e *kafkaWaitError) Error() string { return e.err.Error() }
func (e *kafkaWaitError) Unwrap() error { return e.err }

// watchKafkaWait shows a wait for Kafka that began at began while it
// lasts: past kafkaWaitNoticed it is the relay's LastError (Health is not
// Healthy until a batch commits) and a Warn line, repeated every
// kafkaWaitRepeat. The returned func ends the watch.
func (r *Relay) watchKafkaWait(began time.Time) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		timer := time.NewTimer(kafkaWaitNoticed)
		defer timer.Stop()
		for {
			select {
			case <-done:
				return
			case <-timer.C:
			}
			waited := time.Since(began).Round(time.Second)
			r.obs.Failed(fmt.Errorf("outbox: waiting for Kafka to take a batch since %s (%s)", began.Format(time.RFC3339), waited))
			r.cfg.logger.Warn("outbox: waiting for Kafka to take a batch", "slot", r.cfg.slot, "waited", waited, "gives_up_after", r.cfg.retryFor)
			timer.Reset(kafkaWaitRepeat)
		}
	}()
	return func() { close(done); wg.Wait() }
}

// kafkaWaitNoticed is how long a wait for Kafka lasts before the relay's
// health and log show it; kafkaWaitRepeat how often the log says it
// again.
const (
	kafkaWaitNoticed = 5 * time.Second
	kafkaWaitRepeat  = 30 * time.Second
)

// prepare finds, once, the slot (the outbox's own unless one was
// named), the server's system identifier, which keys the position and
// the default transactional id (so that relays of two servers whose
// databases share a name never mix their positions), and checks that the
// database is ready.
func (r *Relay) prepare(ctx context.Context) error {
	if r.prepared {
		return nil
	}
	if r.cfg.slot == "" {
		slot, err := r.cfg.slotOf(ctx, r.pool)
		if err != nil {
			return err
		}
		r.cfg.slot = slot
	}
	if err := checkReady(ctx, r.pool, r.cfg.names); err != nil {
		return err
	}
	repl, err := r.replicationConfig(ctx)
	if err != nil {
		return err
	}
	conn, err := pgconn.ConnectConfig(ctx, repl)
	if err != nil {
		return fmt.Errorf("outbox: open a replication connection: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("outbox: identify the server: %w", err)
	}
	r.system = sys.SystemID
	r.cfg.key = sys.SystemID + "/" + r.cfg.slot
	if r.cfg.txnID == "" {
		r.cfg.txnID = "eoskit-outbox-" + sys.SystemID + "-" + r.cfg.slot
	}
	r.prepared = true
	return nil
}

// replicationConfig returns the settings of a new replication connection:
// the pool's, as it makes a connection of its own, that is a copy of its
// ConnConfig passed through its BeforeConnect hook if it has one (which
// may set rotated credentials), with replication turned on. Called
// before every replication connect, so that credentials the hook
// rotates reach the relay's sessions too.
func (r *Relay) replicationConfig(ctx context.Context) (*pgconn.Config, error) {
	pc := r.pool.Config() // a copy, ConnConfig included
	if pc.BeforeConnect != nil {
		if err := pc.BeforeConnect(ctx, pc.ConnConfig); err != nil {
			return nil, fmt.Errorf("outbox: the pool's BeforeConnect, for a replication connection: %w", err)
		}
	}
	return replicationConfig(&pc.ConnConfig.Config), nil
}

// token returns the slot's incarnation: a random id the first relay of a
// slot records, which CreateSlot clears when it creates the slot again.
// A position written under another token is an earlier slot's (the
// server restored from a backup and its slot re-created, say), and must
// not count: its log positions say nothing about the new slot's.
func (r *Relay) token(ctx context.Context) (string, error) {
	var token string
	slots := ident(r.cfg.slots())
	// A named outbox's slot whose token the table every outbox shared
	// before schema version 2 holds keeps it (Migrate copied only the
	// slot it was given), if this role may read it: its positions in
	// Kafka carry it.
	shared := `NULL::text`
	if r.cfg.names.name != "" {
		var readable bool
		if err := r.pool.QueryRow(ctx, `SELECT CASE WHEN to_regclass('eoskit_outbox_slots') IS NULL THEN false ELSE has_table_privilege(to_regclass('eoskit_outbox_slots'), 'SELECT') END`).Scan(&readable); err != nil {
			return "", fmt.Errorf("outbox: read slot %s's token: %w", r.cfg.slot, err)
		}
		if readable {
			shared = `(SELECT token FROM eoskit_outbox_slots WHERE slot = $1)`
		}
	}
	err := r.pool.QueryRow(ctx, `WITH ins AS (
			INSERT INTO `+slots+` (slot, token) VALUES ($1, coalesce(`+shared+`, gen_random_uuid()::text))
			ON CONFLICT (slot) DO NOTHING RETURNING token)
		SELECT token FROM ins UNION ALL SELECT token FROM `+slots+` WHERE slot = $1`, r.cfg.slot).Scan(&token)
	if err != nil {
		return "", fmt.Errorf("outbox: read slot %s's token: %w", r.cfg.slot, err)
	}
	return token, nil
}

// tableSchema is the schema of the outbox table: the one table of its
// name the outbox's publication publishes, or, when it publishes several,
// the one the relay's pool resolves the name to (its search_path, as
// Write's does). The stream decodes that table's inserts alone, whatever
// else the publication holds.
func (r *Relay) tableSchema(ctx context.Context) (string, error) {
	table := r.cfg.names.table()
	var published []string
	var resolved pgtype.Text
	err := r.pool.QueryRow(ctx, `SELECT coalesce(array_agg(schemaname::text ORDER BY schemaname), '{}'),
			(SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($2))
		FROM pg_publication_tables WHERE pubname = $1 AND tablename = $2`, r.cfg.names.publication(), table).Scan(&published, &resolved)
	if err != nil {
		return "", fmt.Errorf("outbox: find the outbox table's schema: %w", err)
	}
	switch {
	case len(published) == 1:
		return published[0], nil
	case len(published) == 0:
		return "", fmt.Errorf("%w: publication %s publishes no table %s", ErrSchema, r.cfg.names.publication(), table)
	case resolved.Valid && slices.Contains(published, resolved.String):
		// Several of that name: the one the search path names, as
		// Write's does.
		return resolved.String, nil
	}
	return "", fmt.Errorf("%w: publication %s publishes tables %s in schemas %v, none of them the one the search path names", ErrSchema, r.cfg.names.publication(), table, published)
}

// session is one connection's life: find where to start, open the slot,
// publish batches until an error. It reports whether it published
// anything.
//
// The order matters. The slot is taken first: PostgreSQL lets one session
// hold it, so of two relays starting together one gets it and the other
// stands by, and neither fences the other. Only then does the relay
// fence every other relay of the slot in Kafka and read its position,
// which can then no longer change behind it. The slot streams from its
// own confirmed position, never past the position in Kafka; what Kafka
// already has is skipped.
func (r *Relay) session(ctx context.Context) (progressed bool, err error) {
	if err := r.cfg.checkTopics(ctx); err != nil {
		return false, err
	}
	waited, err := r.awaitSlot(ctx)
	if err != nil {
		return waited, err
	}
	repl, err := r.replicationConfig(ctx)
	if err != nil {
		return waited, err
	}
	schema, err := r.tableSchema(ctx)
	if err != nil {
		return waited, err
	}
	s, err := startStream(ctx, repl, r.cfg.names, schema, 0, r.cfg.statusInterval)
	if slotActive(err) {
		// Another relay took it first: stand by again.
		r.obs.StandingBy(true)
		return waited, &slotTakenError{fmt.Errorf("outbox: another relay took slot %s first: %w", r.cfg.slot, err)}
	}
	if err != nil {
		return waited, err
	}
	defer s.close()
	// Nothing else answers PostgreSQL while the relay waits for Kafka
	// (an unreachable broker, a slow commit): without this, a wait
	// longer than wal_sender_timeout ends the replication session.
	s.keepFor = r.cfg.txnTimeout
	keeping := s.keepAlive(ctx, func(waited time.Duration) {
		r.cfg.logger.Warn("outbox: waiting for Kafka longer than the transaction timeout; no longer keeping the replication session alive, so that a standby may take over",
			"slot", r.cfg.slot, "waited", waited.Round(time.Second), "transaction_timeout", r.cfg.txnTimeout)
	})
	defer keeping()
	if s.system != r.system {
		return waited, finalError{fmt.Errorf("%w: the server's system identifier changed from %s to %s: another server answers at this address", ErrPosition, r.system, s.system)}
	}
	if err := r.beat(ctx, s); err != nil {
		return waited, err
	}
	beating := r.heartbeat(ctx, s)
	defer beating()
	// A fresh producer every session: registering the transactional id
	// is what fences the others, and a producer an earlier session lost
	// to another relay is fenced for good.
	if r.cfg.token, err = r.token(ctx); err != nil {
		return waited, err
	}
	p, err := r.cfg.newPublisher()
	if err != nil {
		return waited, err
	}
	defer p.close()
	// Registering the transactional id may wait for another relay's
	// transaction with it to end; the stream is kept alive meanwhile.
	// The start reads the position, which may take its read and the
	// wait for a transaction still open under the slot's key.
	startDone := s.waiting(r.cfg.txnTimeout + readTimeout + r.cfg.markerWait)
	from, carried, err := p.start(ctx)
	startDone()
	if err != nil {
		return waited, err
	}
	// Rows an earlier relay (or session) published but could not delete:
	// now, and every status interval, until they are gone.
	r.undeleted.mu.Lock()
	maps.Copy(r.undeleted.ids, carried)
	r.undeleted.mu.Unlock()
	r.sweep(ctx)
	sweeping := every(r.cfg.statusInterval, func() { r.sweep(ctx) })
	defer sweeping()
	var wal pglogrepl.LSN
	if err := r.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&wal); err != nil {
		return waited, fmt.Errorf("outbox: read the server's log position: %w", err)
	}
	if from > wal {
		return waited, finalError{fmt.Errorf("%w: the position in %s, %s, is past this server's log (%s): it was written for another incarnation of the server (restored, re-created)",
			ErrPosition, r.cfg.positionTopic, from, wal)}
	}
	s.setConfirmed(from) // already in Kafka: the slot may forget it
	// Health has no partitions to show for a relay: LastAssigned is when
	// it last took its slot and began to read.
	r.obs.NewSession()
	r.obs.StandingBy(false)
	r.obs.Assigned(nil)
	r.cfg.logger.Info("outbox: relay reading", "table", r.cfg.table(), "slot", r.cfg.slot, "published_through", from.String())

	progressed = waited
	published := from
	b := &pending{dead: r.dead}
	for {
		if len(b.txns) == 0 {
			t, err := s.next(ctx, time.Time{}, published)
			if err != nil {
				return progressed, err
			}
			r.obs.Read()
			b.txns = append(b.txns, t)
		}
		cur, next := b, func(until time.Time) (*dbTxn, error) {
			t, err := s.next(ctx, until, published)
			return t, asDatabaseError(err)
		}
		if b.isolate {
			// Finding whose fault a refusal was: the first database
			// transaction alone, its records probed first (see probe),
			// then published with what was refused dead-lettered; or,
			// should that fail again, one record at a time.
			cur = &pending{txns: b.txns[:1], dead: b.dead, oneByOne: b.oneByOne}
			next = func(time.Time) (*dbTxn, error) { return nil, nil }
			if !b.oneByOne {
				err := r.probe(ctx, s, p, b.txns[0])
				switch {
				case errors.Is(err, errNoProbe):
					b.oneByOne, cur.oneByOne = true, true
				case errors.Is(err, eos.ErrFenced) && !r.takenOver(ctx, s):
					return progressed, r.lonelyFence(err)
				case err != nil:
					return progressed, err
				}
			}
		}
		began := time.Now()
		doneWaiting := s.waiting(0)
		// RetryFor bounds the wait for Kafka too: franz-go retries a
		// produce for as long as it is let.
		pubCtx, cancelPub := context.WithTimeout(ctx, r.cfg.retryFor)
		stopWatch := r.watchKafkaWait(began)
		err := p.publish(pubCtx, cur, next, func(ctx context.Context, b *pending) ([]carriedTxn, error) {
			carry, err := r.deleteRows(ctx, b)
			return carry, asDatabaseError(err)
		})
		stopWatch()
		if err != nil && pubCtx.Err() != nil && ctx.Err() == nil {
			err = &kafkaWaitError{fmt.Errorf("outbox: Kafka did not take a batch within RetryFor (%s), giving up: %w", r.cfg.retryFor, err)}
		}
		cancelPub()
		doneWaiting()
		timedOut := errors.Is(err, eos.ErrFenced) && !r.takenOver(ctx, s)
		r.observe(ctx, cur, began, err, timedOut)
		if err == nil {
			published = cur.txns[len(cur.txns)-1].end
			progressed = true
			if r.cfg.hooks.afterCommit != nil && r.cfg.hooks.afterCommit() {
				return progressed, errors.New("outbox: a test ended the session after a commit, before the slot was told")
			}
			for _, t := range cur.txns {
				for _, rw := range t.rows {
					delete(r.dead, rw.id)
				}
				if t.end >= r.iso.end {
					r.iso = isolation{}
				}
			}
			if b.isolate && len(b.txns) > 1 {
				// The rest as usual: a refusal among them isolates
				// again.
				b = &pending{txns: b.txns[1:], dead: r.dead}
			} else {
				b = &pending{dead: r.dead}
			}
			if err := s.published(ctx, published); err != nil {
				return progressed, err
			}
			continue
		}
		if timedOut {
			return progressed, r.lonelyFence(err)
		}
		if final(err) {
			return progressed, err
		}
		if gone := r.cfg.topicGone(ctx, err); gone != nil {
			return progressed, gone
		}
		if retry, err := r.blame(ctx, err, b); !retry {
			return progressed, err
		}
	}
}

// maxLonelyFences bounds how often, within lonelyFenceWindow, a relay
// fenced with no other relay on its slot restarts before it stops as
// fenced.
const (
	maxLonelyFences   = 5
	lonelyFenceWindow = 10 * time.Minute
)

// lonelyFence is what a fence with no other relay holding the slot
// becomes. No relay of this slot can fence this one without taking the
// slot first: the coordinator ended a transaction that outlived its
// timeout (which bumps the epoch), or a producer that is no relay of this
// slot used the transactional id. The first is cured by a new session
// with a new producer (should another relay have taken the slot
// meanwhile, this one stands by), so the error it returns restarts the
// session. The second would not be: two relays of different slots (or
// databases) sharing a transactional id fence each other for ever, each
// restart aborting the other's transaction. Past maxLonelyFences within
// lonelyFenceWindow, it returns err itself, final, naming the likely
// cause.
func (r *Relay) lonelyFence(err error) error {
	now := time.Now()
	r.lonelyFences = append(slices.DeleteFunc(r.lonelyFences, func(t time.Time) bool { return now.Sub(t) > lonelyFenceWindow }), now)
	if len(r.lonelyFences) > maxLonelyFences {
		r.lonelyFences = nil
		return fmt.Errorf("outbox: fenced %d times within %s with no other relay holding slot %s: another producer uses transactional id %q (it must be unique to this slot's relays): %w",
			maxLonelyFences+1, lonelyFenceWindow, r.cfg.slot, r.cfg.txnID, err)
	}
	return fmt.Errorf("outbox: the producer was fenced with no other relay holding the slot (by the coordinator, at a transaction's timeout, or a producer that is no relay): %s", err)
}

// databaseError marks a failure of PostgreSQL (reading the log, deleting
// the rows) within a publish, for the metrics' abort reason.
type databaseError struct{ error }

func (e databaseError) Unwrap() error { return e.error }

// asDatabaseError marks err, if any, as PostgreSQL's.
func asDatabaseError(err error) error {
	if err == nil {
		return nil
	}
	return databaseError{err}
}

// slotTakenError: another relay took the slot first, and this one stands
// by again.
type slotTakenError struct{ error }

func (e *slotTakenError) Unwrap() error { return e.error }

// observe reports a publish of b that began at began and ended with err.
// timedOut: the producer was fenced while the relay still holds its slot,
// so the coordinator ended a transaction that outlived its timeout.
func (r *Relay) observe(ctx context.Context, b *pending, began time.Time, err error, timedOut bool) {
	elapsed := time.Since(began)
	_, dbErr := errors.AsType[databaseError](err)
	switch {
	case err == nil:
		rows, dead := 0, 0
		for _, t := range b.txns {
			rows += len(t.rows)
			for _, rw := range t.rows {
				if _, ok := b.dead[rw.id]; ok {
					dead++
				}
			}
		}
		// Dead letters are not outputs, as in eos.
		r.obs.Committed(rows, rows-dead, elapsed)
		r.obs.DeadLettered(dead)
	case ctx.Err() != nil:
		r.obs.Aborted("shutdown", elapsed)
	case timedOut:
		r.obs.Aborted("timeout", elapsed)
	case dbErr:
		r.obs.Aborted("database-error", elapsed)
	case authz.Refused(err):
		r.obs.Aborted("refused", elapsed)
	case errors.Is(err, eos.ErrFenced):
		r.obs.Fenced()
		r.obs.Aborted("fenced", elapsed)
	case errors.Is(err, eos.ErrOutcomeUnknown):
		r.obs.Aborted("outcome-unknown", elapsed)
	default:
		r.obs.Aborted("produce-error", elapsed)
	}
}

// Health returns what the relay shows probes: whether it runs, when it
// last took its slot (LastAssigned), last committed, and the last error
// it rode out. Its Path is "outbox"; it has no partitions or lag.
func (r *Relay) Health() eoskit.Health { return r.obs.Health() }

// takenOver reports whether another session reads the slot now: the one
// way another relay comes to fence this one in Kafka is to take the slot
// first. A slot nobody reads (this relay's session ended by PostgreSQL,
// say) or one that could not be looked up is not taken over: the next
// session finds out, and stands by if another relay has it by then.
func (r *Relay) takenOver(ctx context.Context, s *stream) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var pid *int32
	err := r.pool.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.slot).Scan(&pid)
	return err == nil && pid != nil && *pid != int32(s.conn.PID())
}

// beat records that this relay's session on the slot (its walsender's
// pid) is alive, for standbys to see.
func (r *Relay) beat(ctx context.Context, s *stream) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.statusInterval)
	defer cancel()
	// Only the session that holds the slot beats: a stalled relay that
	// wakes after its session was ended must not stamp its pid over its
	// successor's, which would make that one look silent to a standby.
	_, err := r.pool.Exec(ctx, `INSERT INTO `+ident(r.cfg.relays())+` (slot, pid, beat_at)
		SELECT $1::text, $2::int, now() WHERE EXISTS (SELECT FROM pg_replication_slots WHERE slot_name::text = $1::text AND active_pid = $2::int)
		ON CONFLICT (slot) DO UPDATE SET pid = EXCLUDED.pid, beat_at = now()`, r.cfg.slot, int32(s.conn.PID()))
	if err != nil {
		return fmt.Errorf("outbox: heartbeat on slot %s: %w", r.cfg.slot, err)
	}
	return nil
}

// heartbeat beats every half status interval until the returned stop is
// called: through a slow commit too (a broker failing over), which a
// standby must not take for a stalled relay. A stopped process (SIGSTOP,
// a paused VM) stops beating and is taken over; Kafka's fencing guards
// the rest. A failed beat is tried again at the next tick.
func (r *Relay) heartbeat(ctx context.Context, s *stream) (stop func()) {
	return every(r.cfg.statusInterval/2, func() {
		if err := r.beat(ctx, s); err != nil && ctx.Err() == nil {
			r.cfg.logger.Warn("outbox: heartbeat failed", "slot", r.cfg.slot, "err", err)
		}
	})
}

// every runs fn every d in a goroutine of its own until the returned stop
// is called, and returns once it has stopped.
func every(d time.Duration, fn func()) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fn()
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// blame decides, after a failed publish, whether one record is at fault
// and may be dead-lettered (retry the same batch) or the error ends the
// session.
func (r *Relay) blame(ctx context.Context, err error, b *pending) (retry bool, _ error) {
	dead := b.dead
	pe, ok := errors.AsType[*eos.ProduceError](err)
	if !ok || pe.Record == nil {
		return false, err
	}
	info, ok := pe.Record.Context.Value(rowKey{}).(rowInfo)
	if !ok || info.id < 0 { // the position record
		return false, err
	}
	cause := pe.Err
	if info.partition >= 0 && strings.Contains(cause.Error(), "invalid record partitioning choice") {
		cause = r.cfg.partitionMissing(ctx, info.topic, info.partition, cause)
	}
	if _, already := dead[info.id]; already {
		err := fmt.Errorf("outbox: the dead letter of record %d could not be written to %s: %w", info.id, r.cfg.deadLetter, cause)
		if recordsFault(cause) {
			return false, finalError{err}
		}
		return false, err // a refused ACL, say: retried for RetryFor (a missing topic is topicGone's)
	}
	if recordsFault(cause) && !b.oneByOne && !errors.Is(cause, ErrInvalidPartition) {
		// Kafka refuses a produce batch whole (one larger than the
		// topic's max.message.bytes, say): every record in it fails
		// alike, and the first is not to blame. Isolate the batch's
		// first database transaction, probing its records; should it
		// be refused again after that, publish it one acknowledged
		// record at a time.
		if !b.isolate {
			r.cfg.logger.Warn("outbox: records refused; probing the batch's records to find whose fault it is", "err", cause)
			b.isolate = true
		} else {
			r.cfg.logger.Warn("outbox: records refused after probing; publishing the database transaction one record at a time", "err", cause)
			b.oneByOne = true
		}
		return true, nil
	}
	rerr := &RecordError{ID: info.id, Topic: info.topic, Partition: info.partition, Err: cause}
	if !recordsFault(cause) {
		// A missing topic or a refused ACL: not the record's fault, and
		// perhaps soon fixed; retried until RetryFor.
		return false, rerr
	}
	if r.cfg.deadLetter == "" {
		return false, finalError{rerr}
	}
	r.cfg.logger.Warn("outbox: record refused; dead-lettering it", "id", info.id, "topic", info.topic, "dead_letter_topic", r.cfg.deadLetter, "err", cause)
	dead[info.id] = cause
	return true, nil
}

// awaitSlot returns once the slot is free, or its holder has gone quiet
// (no heartbeat for three status intervals, where a live relay beats
// every half interval; a holder that never beat counts from its
// connection's start), whose session it then ends. Until then this
// relay is a standby and waits without a deadline: it must not take over
// from a live relay. waited reports that it stood by.
func (r *Relay) awaitSlot(ctx context.Context) (waited bool, err error) {
	quiet := 3 * r.cfg.statusInterval
	for {
		var pid *int32
		var silent *time.Duration
		err := r.pool.QueryRow(ctx, `SELECT s.active_pid, now() - coalesce(h.beat_at, a.backend_start)
			FROM pg_replication_slots s
			LEFT JOIN `+ident(r.cfg.relays())+` h ON h.slot = s.slot_name AND h.pid = s.active_pid
			LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid
			WHERE s.slot_name = $1`, r.cfg.slot).Scan(&pid, &silent)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return waited, fmt.Errorf("%w: %s", ErrNoSlot, r.cfg.slot)
		case isSchemaError(err):
			return waited, fmt.Errorf("%w: %w", ErrSchema, err)
		case err != nil:
			return waited, fmt.Errorf("outbox: look up replication slot %s: %w", r.cfg.slot, err)
		case pid == nil:
			return waited, nil
		case silent == nil || *silent > quiet:
			// A stalled relay (or a dead connection PostgreSQL has not
			// noticed): end its session. Should it wake, the fencing in
			// Kafka that follows stops it.
			r.cfg.logger.Warn("outbox: the slot's holder has gone quiet; ending its session and taking over", "slot", r.cfg.slot, "pid", *pid, "quiet_for", silent)
			if _, err := r.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, *pid); err != nil {
				return waited, fmt.Errorf("outbox: end the quiet session %d on slot %s: %w", *pid, r.cfg.slot, err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if !waited {
			r.cfg.logger.Info("outbox: standing by while another relay holds the slot", "slot", r.cfg.slot, "pid", *pid)
			waited = true
			r.obs.StandingBy(true)
		}
		select {
		case <-ctx.Done():
			return waited, ctx.Err()
		case <-time.After(r.cfg.statusInterval / 4):
		}
	}
}

// deleteRows deletes the batch's rows, and those earlier batches
// could not, in statements of bounded size, and keeps its dead-lettered
// records in the dead-letter table. It runs before the Kafka commit: the
// rows stay in the write-ahead log the slot holds until that commit is
// confirmed, so an abort after it loses nothing. It returns the rows it
// could not delete yet (their transactions not visible yet), which the
// batch's position record carries: a relay that stops before it deletes
// them leaves them to the next.
func (r *Relay) deleteRows(ctx context.Context, b *pending) ([]carriedTxn, error) {
	if err := r.keepDead(ctx, b); err != nil {
		return nil, err
	}
	r.undeleted.mu.Lock()
	defer r.undeleted.mu.Unlock()
	want := maps.Clone(r.undeleted.ids)
	for _, t := range b.txns {
		for _, rw := range t.rows {
			want[rw.id] = t.xid
		}
	}
	left, err := deleteIDs(ctx, r.pool, r.cfg.table(), want, r.cfg.deleteBatch, r.cfg.hooks.hideFromDeletion)
	// Usually a few milliseconds make them visible.
	for try := 0; err == nil && try < 5 && len(left) > 0; try++ {
		time.Sleep(20 * time.Millisecond)
		left, err = deleteIDs(ctx, r.pool, r.cfg.table(), left, r.cfg.deleteBatch, r.cfg.hooks.hideFromDeletion)
	}
	if err != nil {
		// Keep what was wanted: the batch is not committed, and rows
		// already deleted are harmlessly looked for again.
		maps.Copy(r.undeleted.ids, want)
		return nil, err
	}
	r.undeleted.ids = left
	carry, dropped := encodeCarried(left)
	if dropped > 0 {
		r.cfg.logger.Warn("outbox: too many published rows not yet visible to delete; the position record names only some, the relay remembers the rest until it stops",
			"slot", r.cfg.slot, "rows", len(left), "not_carried", dropped)
	}
	return carry, nil
}

// sweep deletes the published rows earlier deletions could not find,
// those of earlier relays included (read back with the position).
func (r *Relay) sweep(ctx context.Context) {
	r.undeleted.mu.Lock()
	defer r.undeleted.mu.Unlock()
	if len(r.undeleted.ids) == 0 {
		return
	}
	left, err := deleteIDs(ctx, r.pool, r.cfg.table(), r.undeleted.ids, r.cfg.deleteBatch, r.cfg.hooks.hideFromDeletion)
	if err != nil {
		if ctx.Err() == nil {
			r.cfg.logger.Warn("outbox: deleting published rows failed; tried again in a status interval", "slot", r.cfg.slot, "rows", len(r.undeleted.ids), "err", err)
		}
		return
	}
	r.undeleted.ids = left
}

// keepDead copies the batch's dead-lettered records into the dead-letter
// table (again harmlessly, if an earlier attempt at the batch did).
func (r *Relay) keepDead(ctx context.Context, b *pending) error {
	if len(b.dead) == 0 {
		return nil
	}
	var ids []int64
	var topics, errs []string
	var parts []*int32
	var keys, values, headers [][]byte
	for _, t := range b.txns {
		for _, rw := range t.rows {
			cause, d := b.dead[rw.id]
			if !d {
				continue
			}
			var p *int32
			if rw.partition >= 0 {
				p = &rw.partition
			}
			ids, topics, parts, errs = append(ids, rw.id), append(topics, rw.rec.Topic), append(parts, p), append(errs, cause.Error())
			keys, values, headers = append(keys, rw.rec.Key), append(values, rw.rec.Value), append(headers, encodeHeaders(rw.rec.Headers))
		}
	}
	_, err := r.pool.Exec(ctx, `INSERT INTO `+ident(r.cfg.deadLetters())+` (id, topic, partition, key, value, headers, error)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::integer[], $4::bytea[], $5::bytea[], $6::bytea[], $7::text[])
		ON CONFLICT (id) DO NOTHING`, ids, topics, parts, keys, values, headers, errs)
	if err != nil {
		return fmt.Errorf("outbox: keep %d dead-lettered records: %w", len(ids), err)
	}
	return nil
}

// pending is a batch being published: whole database transactions, and
// the ids of records that go to the dead-letter topic instead.
type pending struct {
	txns []*dbTxn
	dead map[int64]error
	// isolate: publish the first database transaction alone, probed
	// first (see Relay.probe).
	isolate bool
	// oneByOne: produce each record alone and wait for it, so that a
	// refusal names the record at fault.
	oneByOne bool
}

// rowKey carries a record's outbox identity in its Context, for the
// partitioner and for blame.
type rowKey struct{}

type rowInfo struct {
	id        int64
	topic     string
	partition int32
}

func pinnedTo(p int32) context.Context {
	return context.WithValue(context.Background(), rowKey{}, rowInfo{id: -1, partition: p})
}

// record returns what to produce for rw: the record, or its dead letter.
func (c *config) record(rw row, dead map[int64]error) *kgo.Record {
	info := rowInfo{id: rw.id, topic: rw.rec.Topic, partition: rw.partition}
	cause, isDead := dead[rw.id]
	if !isDead {
		rec := *rw.rec
		rec.Context = context.WithValue(context.Background(), rowKey{}, info)
		return &rec
	}
	// The record's own dead-letter headers go: its writer chose them.
	hs := []kgo.RecordHeader{{Key: loop.HeaderOutboxID, Value: []byte(strconv.FormatInt(rw.id, 10))}}
	if !errors.Is(cause, ErrPositionRecord) {
		// A record addressed as a position names no topic to replay it
		// to: whoever replays it must choose one (-to-topic).
		hs = append(hs, kgo.RecordHeader{Key: loop.HeaderOutboxTopic, Value: []byte(rw.rec.Topic)})
	}
	hs = append(hs, kgo.RecordHeader{Key: loop.HeaderOutboxError, Value: []byte(cause.Error())})
	hs = append(hs, loop.WithoutDeadLetterHeaders(rw.rec.Headers)...)
	value := rw.rec.Value
	if errors.Is(cause, kerr.MessageTooLarge) || errors.Is(cause, kerr.RecordListTooLarge) {
		value = nil // kept, value included, in the dead-letter table
		hs = append(hs, kgo.RecordHeader{Key: loop.HeaderOutboxValue, Value: []byte("omitted (too large); the record is kept in " + c.deadLetters())})
	}
	return &kgo.Record{Topic: c.deadLetter, Key: rw.rec.Key, Value: value, Headers: hs, Timestamp: rw.rec.Timestamp,
		Context: context.WithValue(context.Background(), rowKey{}, rowInfo{id: rw.id, topic: c.deadLetter, partition: -1})}
}

// partitioner sends a record pinned with WriteToPartition (or the position
// record) to its partition, a keyed record where Kafka's default
// partitioner would (murmur2 of the key), and spreads the others.
func partitioner() kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(topic string) func(*kgo.Record, int) int {
		keyed := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
		var mu sync.Mutex
		next := 0
		return func(r *kgo.Record, n int) int {
			if r.Context != nil {
				if info, ok := r.Context.Value(rowKey{}).(rowInfo); ok && info.partition >= 0 {
					return int(info.partition) // out of range fails the record
				}
			}
			if r.Key != nil {
				return keyed.Partition(r, n)
			}
			mu.Lock()
			defer mu.Unlock()
			next = (next + 1) % n
			return next
		}
	})
}

// isSchemaError reports a table or column missing: a schema no retry
// will mend.
func isSchemaError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703")
}
