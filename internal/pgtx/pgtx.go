// Package pgtx is what the database runners (offsetstore, dedup) do to
// the transaction they hold for a batch, written once: the statements that
// open its claim, and the view of it a handler gets.
package pgtx

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/eoskit/eoskit"
)

// ClaimLockTimeout bounds how long a batch's claim (offsetstore's offsets
// rows, dedup's ids) waits for another owner's lock: an owner frozen
// mid-batch must not stall the next one, and the rebalance its poll holds,
// without a word. Past it the claim fails with SQLSTATE 55P03, a wait the
// runner retries without blame.
const ClaimLockTimeout = 10 * time.Second

// QueueClaimStart queues, before a claim's statements and in their round
// trip, what every runner's transaction opens with:
//   - SET CONSTRAINTS ALL IMMEDIATE: a DEFERRABLE INITIALLY DEFERRED
//     constraint a handler's statement breaks fails that statement, inside
//     the record's savepoint, so it is the record's fault, rather than the
//     COMMIT, where no record can be blamed and the batch would be retried
//     as the database's failure until Run gave up;
//   - the claim's lock timeout (ClaimLockTimeout), the one in force before
//     it (the pool's, the role's or the server's) kept in a setting of the
//     transaction for [QueueClaimEnd] to put back.
func QueueClaimStart(b *pgx.Batch) {
	b.Queue(`SET CONSTRAINTS ALL IMMEDIATE`)
	b.Queue(`SELECT set_config('eoskit.lock_timeout_outside_claim', current_setting('lock_timeout'), true)`)
	b.Queue(fmt.Sprintf("SET LOCAL lock_timeout = %d", ClaimLockTimeout.Milliseconds()))
}

// QueueClaimEnd queues, after a claim's statements, the lock timeout that
// was in force before it: the handler's own lock waits are not cut short
// by the claim's bound (and then blamed on its records).
func QueueClaimEnd(b *pgx.Batch) {
	b.Queue(`SELECT set_config('lock_timeout', current_setting('eoskit.lock_timeout_outside_claim'), true)`)
}

// HandlerTx is a transaction as a handler sees it: every statement goes
// to the runner's transaction, and Begin opens a savepoint as on it, but
// Commit and Rollback of the transaction itself return
// eoskit.ErrRunnerOwnsTx and are remembered: the runner then ends Run
// with [Misused], whatever the handler returned, since its writes cannot
// be what it meant (a Rollback "to skip the record" would commit its
// partial writes; a Commit would commit them outside the batch). Without
// it, a handler's Commit ended the runner's transaction early:
// offsetstore's offsets row never moved and the batch's effects were
// applied again at every retry; dedup's claims were released with it.
type HandlerTx struct {
	pgx.Tx
	ended atomic.Pointer[string] // "Commit" or "Rollback", once called
}

// ForHandler wraps tx for a handler call.
func ForHandler(tx pgx.Tx) *HandlerTx { return &HandlerTx{Tx: tx} }

// Commit refuses: the transaction is the runner's.
func (t *HandlerTx) Commit(context.Context) error { return t.refuse("Commit") }

// Rollback refuses: the transaction is the runner's.
func (t *HandlerTx) Rollback(context.Context) error { return t.refuse("Rollback") }

func (t *HandlerTx) refuse(op string) error {
	t.ended.CompareAndSwap(nil, &op)
	return eoskit.ErrRunnerOwnsTx
}

// Misused returns, once the handler returned, the error Run ends with when
// the handler called Commit or Rollback (wrapping eoskit.ErrRunnerOwnsTx),
// or nil.
func (t *HandlerTx) Misused(pkg string) error {
	op := t.ended.Load()
	if op == nil {
		return nil
	}
	return fmt.Errorf("%s: the handler called tx.%s: %w", pkg, *op, eoskit.ErrRunnerOwnsTx)
}
