package dedup

import "github.com/eoskit/eoskit/internal/deadletter"

// DeadLetterTable is the table the [DeadLetter] policy parks records in,
// created by [PostgresStore.Migrate]: the one offsetstore parks in, whose
// columns offsetstore.DeadLetterTable lists. A record is parked in the
// transaction that claims its id, so that a later copy is skipped; its
// row keeps that claim (claim_table, claim_scope, claim_id), and `eoskit
// dead-letters replay` releases it in the transaction that sends the
// record back through the outbox, so that the replayed record is applied
// (once) instead of skipped as a copy.
const DeadLetterTable = deadletter.Table
