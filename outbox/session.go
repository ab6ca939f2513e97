package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
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

// openSession opens what a session publishes with: it finds where to
// start, takes the slot, keeps the stream alive and beating, registers a
// fresh producer and starts the sweep of undeleted rows. It reports
// whether it waited for the slot (a wait the relay stood by in, which
// counts as progress). What it opened, the returned relaySession closes;
// on an error it closes it itself.
//
// The order matters. The slot is taken first: PostgreSQL lets one session
// hold it, so of two relays starting together one gets it and the other
// stands by, and neither fences the other. Only then does the relay
// fence every other relay of the slot in Kafka and read its position,
// which can then no longer change behind it. The slot streams from its
// own confirmed position, never past the position in Kafka; what Kafka
// already has is skipped.
func (r *Relay) openSession(ctx context.Context) (_ *relaySession, waited bool, err error) {
	rs := &relaySession{}
	defer func() {
		if err != nil {
			rs.close()
		}
	}()
	if err := r.cfg.checkTopics(ctx); err != nil {
		return nil, false, err
	}
	if waited, err = r.awaitSlot(ctx); err != nil {
		return nil, waited, err
	}
	repl, err := r.replicationConfig(ctx)
	if err != nil {
		return nil, waited, err
	}
	schema, err := r.tableSchema(ctx)
	if err != nil {
		return nil, waited, err
	}
	s, err := startStream(ctx, repl, r.cfg.names, schema, 0, r.cfg.statusInterval)
	if slotActive(err) {
		// Another relay took it first: stand by again.
		r.obs.StandingBy(true)
		return nil, waited, &slotTakenError{fmt.Errorf("outbox: another relay took slot %s first: %w", r.cfg.slot, err)}
	}
	if err != nil {
		return nil, waited, err
	}
	rs.s = s
	rs.closers = append(rs.closers, s.close)
	// Where the slot resumes: the log below it is not streamed again.
	var resumes pglogrepl.LSN
	if err := r.pool.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn, '0/0') FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.slot).Scan(&resumes); err != nil {
		return nil, waited, fmt.Errorf("outbox: read slot %s's confirmed position: %w", r.cfg.slot, err)
	}
	// Nothing else answers PostgreSQL while the relay waits for Kafka
	// (an unreachable broker, a slow commit): without this, a wait
	// longer than wal_sender_timeout ends the replication session.
	s.keepFor = r.cfg.txnTimeout
	keeping := s.keepAlive(ctx, func(waited time.Duration) {
		r.cfg.logger.Warn("outbox: waiting for Kafka longer than the transaction timeout; no longer keeping the replication session alive, so that a standby may take over",
			"slot", r.cfg.slot, "waited", waited.Round(time.Second), "transaction_timeout", r.cfg.txnTimeout)
	})
	rs.closers = append(rs.closers, keeping)
	if s.system != r.system {
		return nil, waited, finalError{fmt.Errorf("%w: the server's system identifier changed from %s to %s: another server answers at this address", ErrPosition, r.system, s.system)}
	}
	if err := r.beat(ctx, s); err != nil {
		return nil, waited, err
	}
	rs.closers = append(rs.closers, r.heartbeat(ctx, s))
	// A fresh producer every session: registering the transactional id
	// is what fences the others, and a producer an earlier session lost
	// to another relay is fenced for good.
	if r.cfg.token, err = r.token(ctx); err != nil {
		return nil, waited, err
	}
	p, err := r.cfg.newPublisher()
	if err != nil {
		return nil, waited, err
	}
	rs.p = p
	rs.closers = append(rs.closers, p.close)
	// Registering the transactional id may wait for another relay's
	// transaction with it to end; the stream is kept alive meanwhile.
	// The start reads the position, which may take its read and the
	// wait for a transaction still open under the slot's key.
	startDone := s.waiting(r.cfg.txnTimeout + readTimeout + r.cfg.markerWait)
	from, carried, err := p.start(ctx)
	startDone()
	if err != nil {
		return nil, waited, err
	}
	var wal pglogrepl.LSN
	if err := r.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&wal); err != nil {
		return nil, waited, fmt.Errorf("outbox: read the server's log position: %w", err)
	}
	if from.end > wal {
		return nil, waited, finalError{fmt.Errorf("%w: %w: the position in %s, %s, is past this server's log (%s): it was written for another incarnation of the server (restored, re-created)",
			ErrRewound, ErrPosition, r.cfg.positionTopic, from.end, wal)}
	}
	// Rows an earlier relay (or session) published but could not delete:
	// swept now, and every status interval, until they are gone; but
	// only from a log found to be the one Kafka's position was written
	// from (a restored server reuses row ids: sweeping by id would delete
	// rows nobody published).
	adopt := func() {
		r.undeleted.mu.Lock()
		maps.Copy(r.undeleted.ids, carried)
		r.undeleted.mu.Unlock()
	}
	// A log that still reaches the position must hold there the
	// transaction Kafka's position ends with: a database restored to
	// before it streams other transactions over that stretch, which
	// would be taken for published (see stream.verified).
	if from.xid != 0 && resumes < from.end {
		s.verifyAt(from, resumes, adopt)
	} else {
		adopt()
		r.sweep(ctx)
	}
	rs.closers = append(rs.closers, every(r.cfg.statusInterval, func() {
		if !s.verifying() {
			r.sweep(ctx)
		}
	}))
	s.setConfirmed(from.end) // already in Kafka: the slot may forget it (held while verifying)
	// Health has no partitions to show for a relay: LastAssigned is when
	// it last took its slot and began to read.
	r.obs.NewSession()
	r.obs.StandingBy(false)
	r.obs.Assigned(nil)
	r.cfg.logger.Info("outbox: relay reading", "table", r.cfg.table(), "slot", r.cfg.slot, "published_through", from.end.String())
	rs.from = from.end
	return rs, waited, nil
}

// relaySession is what openSession opened: the stream, the publisher,
// and where Kafka's position stands; close ends everything opened, the
// last first.
type relaySession struct {
	s       *stream
	p       publisher
	from    pglogrepl.LSN
	closers []func()
}

func (rs *relaySession) close() {
	for i := len(rs.closers) - 1; i >= 0; i-- {
		rs.closers[i]()
	}
	rs.closers = nil
}

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
