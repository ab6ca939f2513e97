package offsetstore

import "github.com/eoskit/eoskit"

// DeadLetter parks the record (key, value, coordinates, error) in the
// eoskit_dead_letters table, in the same transaction that stores its offset
// and commits the rest of its batch, and goes on: the record is then parked
// with its offset stored, or neither. Give it to [OnHandlerError], alone,
// as a Retry's fallback (eoskit.Retry(...).Then(DeadLetter())) or in a
// rule of [eoskit.Classify].
func DeadLetter() eoskit.ErrorPolicy { return eoskit.DeadLetterTo("") }
