package outbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/twmb/franz-go/pkg/kgo"
)

// row is one outbox record read from the log.
type row struct {
	id        int64
	partition int32 // -1: by key
	rec       *kgo.Record
}

// dbTxn is one committed database transaction's outbox records, in the
// order it wrote them.
type dbTxn struct {
	end pglogrepl.LSN // the end of its commit record: the position once published
	xid uint32        // its transaction id, which its rows' xmin is
	// committed is its commit time, in microseconds since 1970, as
	// PostgreSQL stamped it.
	committed int64
	rows      []row
}

// stream reads committed transactions from a logical replication slot
// through pgoutput, in commit order. It confirms to PostgreSQL only what it
// is told has been published.
type stream struct {
	// mu serializes the use of conn: next, published and the keeper
	// that keepAlive starts.
	mu     sync.Mutex
	conn   *pgconn.PgConn
	system string // the server's system identifier
	slot   string
	// schema and table name the outbox table, whose inserts it decodes
	// (its publication may hold others, of the same name too)
	schema, table string
	confirmed     pglogrepl.LSN // what the slot may forget: published, or idle past
	interval      time.Duration // between status updates
	nextSend      time.Time
	// waitingSince is when the relay began its current wait for Kafka
	// (unix nanoseconds; 0: not waiting), which the keeper keeps the
	// session alive through for at most keepFor (waitingFor, when the
	// wait set one: the start's position read may take longer).
	waitingSince, waitingFor atomic.Int64
	keepFor                  time.Duration

	relID   uint32
	columns map[string]int
	cur     *dbTxn // between Begin and Commit
	// handed is the end of the last transaction next returned; until it
	// is published, nothing past confirmed may be confirmed.
	handed pglogrepl.LSN
	// idle is how far the log was read with nothing in it to publish
	// (keepalives, transactions without outbox records): safe to confirm
	// once everything handed out is published.
	idle pglogrepl.LSN
	// verify, when set, is Kafka's position, which the log streamed from
	// below it must hold: the transaction with its id must end there.
	// Cleared once the stream passed it and found it (then verified
	// runs); kept for good when it did not. Meanwhile the slot is told
	// nothing past hold, where it resumed: a log found rewound must keep
	// what it holds for the operator's decision.
	verify   *published
	hold     pglogrepl.LSN
	onVerify func()
}

// replicationConfig turns a pool's connection settings into a
// logical-replication connection's. The pool's context watcher is not
// kept: with pgconn's CancelRequestContextWatcherHandler, every read
// deadline the stream sets would cancel the walsender's work; the
// replication connection gets pgconn's default, which ends a read by its
// deadline on the socket.
func replicationConfig(cfg *pgconn.Config) *pgconn.Config {
	c := cfg.Copy()
	if c.RuntimeParams == nil {
		c.RuntimeParams = map[string]string{}
	}
	c.RuntimeParams["replication"] = "database"
	c.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	return c
}

// errSlotActive is what START_REPLICATION answers while another session
// reads the slot.
func slotActive(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55006"
}

// startStream opens the outbox's slot at from (PostgreSQL starts at the
// slot's confirmed position if that is later; 0 is the slot's own), to
// decode the inserts of the outbox's publication into its table, in
// schema.
func startStream(ctx context.Context, cfg *pgconn.Config, n names, schema string, from pglogrepl.LSN, statusInterval time.Duration) (*stream, error) {
	slot := n.slot
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox: open a replication connection: %w", err)
	}
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("outbox: identify the server: %w", err)
	}
	err = pglogrepl.StartReplication(ctx, conn, slot, from, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			fmt.Sprintf("publication_names '%s'", n.publication()), // [a-z0-9_]: nothing to escape
			"binary 'true'",
		},
	})
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("outbox: start replication from slot %s at %s: %w", slot, from, err)
	}
	return &stream{conn: conn, system: sys.SystemID, slot: slot, schema: schema, table: n.table(), confirmed: from, interval: statusInterval, nextSend: time.Now()}, nil
}

// keepAlive sends the status update that is due (every status
// interval) while nobody reads the stream, until the returned stop is
// called: so that wal_sender_timeout does not end the session while the
// relay waits elsewhere (for Kafka, mostly). While next reads, next
// sends them itself. A wait for Kafka (see waiting) is kept alive for
// keepFor, the transaction timeout: past it the Kafka transaction is
// lost anyway, and a relay that stays stuck lets PostgreSQL end its
// session, so that a standby (which may reach Kafka) can take over.
func (s *stream) keepAlive(ctx context.Context, lapsed func(waited time.Duration)) (stop func()) {
	tick := min(s.interval/4, time.Second)
	warned := int64(0)
	return every(tick, func() {
		if !s.mu.TryLock() {
			return // next is reading, and answering
		}
		defer s.mu.Unlock()
		if time.Now().Before(s.nextSend) {
			return
		}
		if since := s.waitingSince.Load(); since != 0 {
			keep := s.keepFor
			if d := time.Duration(s.waitingFor.Load()); d > 0 {
				keep = d
			}
			if waited := time.Since(time.Unix(0, since)); waited > keep {
				if warned != since {
					warned = since
					lapsed(waited)
				}
				return
			}
		}
		sctx, cancel := context.WithTimeout(ctx, s.interval)
		defer cancel()
		// A failure shows at the next read, which ends the session.
		_ = s.sendStatus(sctx)
	})
}

// waiting marks a wait for Kafka, until the returned done is called; the
// keeper keeps the session alive through it for bound (0: keepFor).
func (s *stream) waiting(bound time.Duration) (done func()) {
	s.waitingFor.Store(int64(bound))
	s.waitingSince.Store(time.Now().UnixNano())
	return func() { s.waitingSince.Store(0); s.waitingFor.Store(0) }
}

// setConfirmed sets what the slot may forget, as the session starts.
func (s *stream) setConfirmed(lsn pglogrepl.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.confirmed = lsn
}

// verifyAt makes the stream check the log against Kafka's position p
// (see verified), telling the slot nothing past resumes meanwhile, and
// run onVerified once the log passed the check.
func (s *stream) verifyAt(p published, resumes pglogrepl.LSN, onVerified func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.verify, s.hold, s.onVerify = &p, resumes, onVerified
}

// verifying reports whether the check of verifyAt is still under way, or
// failed.
func (s *stream) verifying() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.verify != nil
}

func (s *stream) close() { _ = s.conn.Close(context.Background()) }

// next returns the next committed transaction with outbox records, or nil
// when until passes first. skipThrough drops transactions already
// published (their end at or before it).
func (s *stream) next(ctx context.Context, until time.Time, skipThrough pglogrepl.LSN) (*dbTxn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if time.Now().After(s.nextSend) {
			if err := s.sendStatus(ctx); err != nil {
				return nil, err
			}
		}
		if !until.IsZero() && !time.Now().Before(until) && s.cur == nil {
			return nil, nil
		}
		deadline := s.nextSend
		if !until.IsZero() && until.Before(deadline) && s.cur == nil {
			deadline = until
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && pgconn.Timeout(err) {
				continue
			}
			return nil, fmt.Errorf("outbox: read slot %s: %w", s.slot, err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return nil, fmt.Errorf("outbox: read slot %s: %w", s.slot, pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyData:
			t, err := s.handle(msg.Data, skipThrough)
			if t != nil {
				s.handed = t.end
			}
			if err != nil || t != nil {
				return t, err
			}
		}
	}
}

func (s *stream) handle(data []byte, skipThrough pglogrepl.LSN) (*dbTxn, error) {
	if len(data) == 0 {
		return nil, nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return nil, fmt.Errorf("outbox: slot %s: %w", s.slot, err)
		}
		if s.cur == nil && ka.ServerWALEnd > s.idle {
			s.idle = ka.ServerWALEnd
		}
		if ka.ReplyRequested {
			s.nextSend = time.Time{}
		}
		return nil, nil
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return nil, fmt.Errorf("outbox: slot %s: %w", s.slot, err)
		}
		return s.decode(x.WALData, skipThrough)
	}
	return nil, nil
}

func (s *stream) decode(wal []byte, skipThrough pglogrepl.LSN) (*dbTxn, error) {
	m, err := pglogrepl.Parse(wal)
	if err != nil {
		return nil, fmt.Errorf("outbox: slot %s: decode: %w", s.slot, err)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		if m.Namespace != s.schema || m.RelationName != s.table {
			return nil, nil // another table the publication holds
		}
		cols := map[string]int{}
		for i, c := range m.Columns {
			cols[c.Name] = i
		}
		for _, name := range []string{"id", "topic", "partition", "key", "value", "headers"} {
			if _, ok := cols[name]; !ok {
				return nil, fmt.Errorf("%w: column %s is missing", ErrTableChanged, name)
			}
		}
		s.relID, s.columns = m.RelationID, cols
	case *pglogrepl.BeginMessage:
		s.cur = &dbTxn{xid: m.Xid}
	case *pglogrepl.InsertMessage:
		if s.cur == nil {
			return nil, fmt.Errorf("outbox: slot %s: an insert outside a transaction", s.slot)
		}
		if m.RelationID != s.relID || s.columns == nil {
			return nil, nil
		}
		r, err := s.decodeRow(m.Tuple)
		if err != nil {
			return nil, err
		}
		s.cur.rows = append(s.cur.rows, r)
	case *pglogrepl.CommitMessage:
		t := s.cur
		s.cur = nil
		if t == nil {
			return nil, fmt.Errorf("outbox: slot %s: a commit without its begin", s.slot)
		}
		t.end, t.committed = m.TransactionEndLSN, m.CommitTime.UnixMicro()
		if err := s.verified(t); err != nil {
			return nil, err
		}
		if len(t.rows) == 0 || t.end <= skipThrough {
			if m.TransactionEndLSN > s.idle {
				s.idle = m.TransactionEndLSN
			}
			return nil, nil
		}
		for _, r := range t.rows {
			r.rec.Timestamp = m.CommitTime
		}
		return t, nil
	}
	return nil, nil
}

// verified checks t, a transaction the slot streamed, against Kafka's
// position while the stream is below or at it (verify): the transaction
// that ends there must be the one Kafka's position names. A transaction
// of another id or commit time ending there (a restored server reuses
// transaction ids, and a workload of regular transactions their log
// positions too), or one ending past it with none ending there, means
// the log was rewound: the database was restored to before
// the position, and new transactions took the stretch of log the
// published ones had. Taking them for published would skip them.
func (s *stream) verified(t *dbTxn) error {
	v := s.verify
	if v == nil || t.end < v.end {
		return nil
	}
	if t.end == v.end && t.xid == v.xid && (v.committed == 0 || t.committed == v.committed) {
		s.verify = nil
		if s.onVerify != nil {
			s.onVerify()
		}
		return nil
	}
	// Failed: verify stays set, so that nothing past hold is confirmed
	// whatever runs before the session ends (the keeper included).
	found := fmt.Sprintf("transaction %d, committed at %s, ends there", t.xid, time.UnixMicro(t.committed).UTC().Format(time.RFC3339Nano))
	if t.end > v.end {
		found = fmt.Sprintf("no transaction ends there (transaction %d ends at %s)", t.xid, t.end)
	}
	return finalError{fmt.Errorf("%w: Kafka's position of slot %s ends with transaction %d, committed at %s, at %s, but in this log %s. "+
		"New transactions would be taken for published ones and skipped; the relay publishes nothing until an operator decides (see the outbox documentation, \"A database restored from a backup\")",
		ErrRewound, s.slot, v.xid, time.UnixMicro(v.committed).UTC().Format(time.RFC3339Nano), v.end, found)}
}

// decodeRow reads a row sent in binary: bigint, text, integer and bytea
// in their binary send formats.
func (s *stream) decodeRow(t *pglogrepl.TupleData) (row, error) {
	col := func(name string) *pglogrepl.TupleDataColumn {
		i := s.columns[name]
		if i >= len(t.Columns) {
			return nil
		}
		return t.Columns[i]
	}
	bytesOf := func(name string) ([]byte, bool, error) {
		c := col(name)
		switch {
		case c == nil || c.DataType == pglogrepl.TupleDataTypeNull:
			return nil, false, nil
		case c.DataType == pglogrepl.TupleDataTypeBinary:
			return c.Data, true, nil
		default:
			return nil, false, fmt.Errorf("%w: column %s came as %q, not binary", ErrTableChanged, name, c.DataType)
		}
	}
	r := row{partition: -1}
	id, ok, err := bytesOf("id")
	if err != nil || !ok || len(id) != 8 {
		return r, fmt.Errorf("%w: id is not a bigint (%v)", ErrTableChanged, err)
	}
	r.id = int64(binary.BigEndian.Uint64(id))
	topic, ok, err := bytesOf("topic")
	if err != nil || !ok {
		return r, fmt.Errorf("%w: row %d has no topic (%v)", ErrTableChanged, r.id, err)
	}
	part, ok, err := bytesOf("partition")
	if err != nil || ok && len(part) != 4 {
		return r, fmt.Errorf("%w: row %d: partition is not an integer (%v)", ErrTableChanged, r.id, err)
	}
	if ok {
		r.partition = int32(binary.BigEndian.Uint32(part))
	}
	rec := &kgo.Record{Topic: string(topic)}
	if rec.Key, _, err = bytesOf("key"); err != nil {
		return r, err
	}
	if rec.Value, _, err = bytesOf("value"); err != nil {
		return r, err
	}
	h, _, err := bytesOf("headers")
	if err != nil {
		return r, err
	}
	if rec.Headers, err = decodeHeaders(h); err != nil {
		return r, fmt.Errorf("row %d: %w", r.id, err)
	}
	r.rec = rec
	return r, nil
}

// published records that everything through end reached Kafka, so the
// slot may forget it.
func (s *stream) published(ctx context.Context, end pglogrepl.LSN) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if end > s.confirmed {
		s.confirmed = end
	}
	if end > s.idle {
		s.idle = end
	}
	return s.sendStatus(ctx)
}

// sendStatus tells PostgreSQL what the slot may forget: what was
// published, or, while nothing is pending, how far the log was read.
func (s *stream) sendStatus(ctx context.Context) error {
	pos := s.confirmed
	if s.idle > pos && s.cur == nil && s.handed <= s.confirmed {
		pos = s.idle
	}
	if s.verify != nil {
		pos = s.hold
	}
	s.nextSend = time.Now().Add(s.interval)
	err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos})
	if err != nil {
		return fmt.Errorf("outbox: confirm %s on slot %s: %w", pos, s.slot, err)
	}
	return nil
}
