package state

// ReservedPrefix begins the keys eoskit keeps in a store for itself (a
// windowed aggregation's stream time): they commit and restore with the
// rest of the state, but [Updates] leaves them out and a processor's
// state view does not show them. A handler's own keys must not begin with
// it.
const ReservedPrefix = "\x00eoskit:"

// IsReserved reports whether key begins with [ReservedPrefix].
func IsReserved(key []byte) bool {
	// A comparison of the converted prefix copies nothing, where
	// strings.HasPrefix(string(key), ...) converts the whole key.
	return len(key) >= len(ReservedPrefix) && string(key[:len(ReservedPrefix)]) == ReservedPrefix
}
