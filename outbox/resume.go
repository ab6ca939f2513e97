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
// published, and its log from lsn on is new (lsn is where the restored
// server's log began to differ: a point-in-time recovery's target, or the
// end of the log the backup or snapshot holds, which PostgreSQL's log
// names as "redo done at" or "consistent recovery state reached at").
// It commits a position at lsn for the relay's slot in the position topic,
// under the relay's transactional id, which fences any relay of the slot
// still running; the next Run publishes every transaction the slot streams
// that ends past lsn, and takes those ending at or before it as
// published. It does not check what it is told: a point too early
// publishes again what Kafka has, a point too late skips what it has not.
// Rows of transactions at or before lsn stay in the outbox table: they
// were published; delete them once checked.
//
// It needs the exactly-once relay (an at-least-once one keeps no
// position) and no Run of r running, and refuses an lsn past the server's
// log.
func (r *Relay) ResumeAfter(ctx context.Context, lsn string) error {
	at, err := pglogrepl.ParseLSN(lsn)
	switch {
	case err != nil:
		return &eoskit.ConfigError{Package: "outbox", Setting: "ResumeAfter", Reason: fmt.Sprintf("%q is no log position (want the form 0/1A2B3C4): %v", lsn, err), Err: err}
	case r.cfg.semantics == eos.AtLeastOnce:
		return &eoskit.ConfigError{Package: "outbox", Setting: "ResumeAfter", Reason: "an at-least-once relay keeps no position in Kafka"}
	case r.shell.Running():
		return errors.New("outbox: ResumeAfter while this relay runs: stop it first")
	}
	if err := r.prepare(ctx); err != nil {
		return err
	}
	if r.cfg.token, err = r.token(ctx); err != nil {
		return err
	}
	var wal pglogrepl.LSN
	if err := r.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()`).Scan(&wal); err != nil {
		return fmt.Errorf("outbox: read the server's log position: %w", err)
	}
	if at > wal {
		return &eoskit.ConfigError{Package: "outbox", Setting: "ResumeAfter", Reason: fmt.Sprintf("%s is past this server's log (%s)", at, wal)}
	}
	pub, err := r.cfg.newPublisher() // the relay's producer: its transactional id and partitioner
	if err != nil {
		return err
	}
	defer pub.close()
	err = pub.(*txnPublisher).p.Transact(ctx, func(tx *eos.Tx) error {
		// No transaction id or commit time: the next Run has nothing to
		// verify the log against at lsn, and takes it as it is.
		return tx.ProduceSync(positionRecord(r.cfg.positionTopic, r.cfg.key, r.cfg.token, &dbTxn{end: at}, nil))
	})
	if err != nil {
		return fmt.Errorf("outbox: commit the position %s for slot %s: %w", at, r.cfg.slot, err)
	}
	r.cfg.logger.Warn("outbox: an operator moved the relay's position; the next run publishes what ends past it",
		"slot", r.cfg.slot, "position", at.String())
	return nil
}
