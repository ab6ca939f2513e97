package dedup

import "github.com/eoskit/eoskit"

// DeadLetter parks the record (key, value, coordinates, error) in the
// eoskit_dead_letters table, which the store's Migrate creates, in the
// transaction that claims its id and applies the rest of its batch, and
// goes on: a copy of it that arrives later is skipped like any processed
// id. Give it to [OnHandlerError], alone, as a Retry's fallback
// (eoskit.Retry(...).Then(DeadLetter())) or in a rule of
// [eoskit.Classify].
func DeadLetter() eoskit.ErrorPolicy { return eoskit.DeadLetterTo("") }
