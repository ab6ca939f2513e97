package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// ResumeAfter is an operator's decision once a relay refused with
// [ErrRewound]: the database was restored to before what the relay last
// published, and its log past lsn is new.
// lsn is where the restored server's log ends: a point-in-time recovery's
// target LSN; for a backup or a snapshot, its last checkpoint (pg_controldata's
// "Latest checkpoint location" of the restored data, or SELECT checkpoint_lsn
// FROM pg_control_checkpoint() before the server takes new writes). A point
// before the true end publishes again what lies between (duplicates, never
// a loss); a point past it skips what it should not.
// It commits a position at lsn for the relay's slot in the position topic,
// under the relay's transactional id, which fences any relay of the slot
// still running; the next Run publishes every transaction the slot streams
// that ends past lsn, and takes those ending at or before it as
// published. It cannot check what it is told beyond the bounds below.
// Rows of transactions at or before lsn stay in the outbox table: they
// were published; delete them once checked.
//
// It needs the exactly-once relay (an at-least-once one keeps no
// position) and no Run of r running (eoskit.ErrRunning, which it keeps
// from starting meanwhile), and refuses an lsn past the server's log, or
// before the point the slot resumes at (what lies between is no longer
// streamed). The position it writes names no transaction to check, so a
// second restore before the relay's next publish goes unseen.
func (r *Relay) ResumeAfter(ctx context.Context, lsn string) error {
	at, err := pglogrepl.ParseLSN(lsn)
	switch {
	case err != nil:
		return &eoskit.ConfigError{Package: "outbox", Setting: "ResumeAfter", Reason: fmt.Sprintf("%q is no log position (want the form 0/1A2B3C4): %v", lsn, err), Err: err}
	case r.cfg.semantics == eos.AtLeastOnce:
		return &eoskit.ConfigError{Package: "outbox", Setting: "ResumeAfter", Reason: "an at-least-once relay keeps no position in Kafka"}
	}
	err = r.shell.Exclusive(func() error { return r.resumeAfter(ctx, at) })
	if errors.Is(err, eoskit.ErrRunning) {
		return fmt.Errorf("outbox: ResumeAfter while this relay runs, stop it first: %w", err)
	}
	return err
}

func (r *Relay) resumeAfter(ctx context.Context, at pglogrepl.LSN) error {
	if err := r.prepare(ctx); err != nil {
		return err
	}
	var err error
	if r.cfg.token, err = r.token(ctx); err != nil {
		return err
	}
	var wal, confirmed pglogrepl.LSN
	if err := r.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn(), coalesce((SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = $1), '0/0')`, r.cfg.slot).Scan(&wal, &confirmed); err != nil {
		return fmt.Errorf("outbox: read the server's log position: %w", err)
	}
	switch {
	case at > wal:
		return &eoskit.ConfigError{Package: "outbox", Setting: "ResumeAfter", Reason: fmt.Sprintf("%s is past this server's log (%s)", at, wal)}
	case at < confirmed:
		// The slot no longer streams what lies between: the relay would
		// skip it.
		return &eoskit.ConfigError{Package: "outbox", Setting: "ResumeAfter", Reason: fmt.Sprintf("slot %s resumes at %s, past %s: the transactions between are no longer streamed", r.cfg.slot, confirmed, at)}
	}
	pub, err := r.cfg.newPublisher() // the relay's producer: its transactional id and partitioner
	if err != nil {
		return err
	}
	defer pub.close()
	err = pub.(*txnPublisher).p.Transact(ctx, func(tx *eos.Tx) error {
		// No transaction id or commit time: the next Run has nothing to
		// verify the log against at lsn, and takes it as it is. No
		// undeleted rows either: those of the earlier log's position are
		// ids a restored server may give other rows.
		return tx.ProduceSync(positionRecord(r.cfg.positionTopic, r.cfg.key, r.cfg.token, &dbTxn{end: at}, nil))
	})
	if err != nil {
		return fmt.Errorf("outbox: commit the position %s for slot %s: %w", at, r.cfg.slot, err)
	}
	// What this relay remembers of the earlier log goes with it.
	r.undeleted.mu.Lock()
	clear(r.undeleted.ids)
	r.undeleted.mu.Unlock()
	clear(r.dead)
	r.iso = isolation{}
	r.cfg.logger.Warn("outbox: an operator moved the relay's position; the next run publishes what ends past it",
		"slot", r.cfg.slot, "position", at.String())
	return nil
}
