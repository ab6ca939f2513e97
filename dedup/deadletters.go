package dedup

import "github.com/eoskit/eoskit/internal/deadletter"

// DeadLetterTable is the table the [DeadLetter] policy parks records in,
// created by [PostgresStore.Migrate]: the one offsetstore parks in, whose
// columns offsetstore.DeadLetterTable lists. A record is parked in the
// transaction that claims its id, so that a later copy is skipped; its
// row keeps that claim (claim_schema, claim_table, claim_scope, claim_id),
// and `eoskit dead-letters replay` releases it in the transaction that
// sends the record back through the outbox, so that the replayed record is
// applied (once) instead of skipped as a copy, and only in a table its
// owner marked as a claim table ([PostgresStore.Migrate] marks its ids
// table with a comment: a row, which any runner's role may write, cannot
// make the replay delete elsewhere with the operator's rights). A claim
// purged since
// ([PostgresStore.Purge]) and made again by a later copy, which was then
// applied, is not released: the replay is skipped as that copy's
// duplicate.
const DeadLetterTable = deadletter.Table
