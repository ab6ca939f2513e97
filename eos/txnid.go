package eos

import (
	"fmt"
	"regexp"

	"github.com/eoskit/eoskit"
)

var txnIDPart = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// StableTransactionalID builds the transactional id of one instance of an
// application: prefix + "-" + instance, for example "orders-enricher-2".
//
// The prefix names the application (the same for all its instances); the
// instance names the slot this process fills, and must be the same after a
// restart: a StatefulSet pod name, a configured ordinal, a host name that
// does not change. Never a random value or a process id. The broker fences a
// producer when a newer one registers the same id, which is what stops a
// zombie instance; an id that changes on every restart fences nothing, and
// leaves the dead instance's open transaction behind to stall read_committed
// readers until the transaction timeout, and the broker's producer state
// grows with every restart.
//
// Both parts must be non-empty and use only letters, digits, '.', '_' and
// '-'.
func StableTransactionalID(prefix, instance string) (string, error) {
	for _, p := range []struct{ name, v string }{{"prefix", prefix}, {"instance", instance}} {
		if !txnIDPart.MatchString(p.v) {
			return "", &eoskit.ConfigError{Package: "eos", Setting: "TransactionalID", Reason: fmt.Sprintf("%s %q must be non-empty and use only [a-zA-Z0-9._-]", p.name, p.v)}
		}
	}
	return prefix + "-" + instance, nil
}
