package testbed

import (
	"testing"

	"github.com/eoskit/eoskit/integration"
	"github.com/eoskit/eoskit/internal/txnscan"
)

// UniqueNegativeHashName is [integration.UniqueName] for a name whose Java
// String.hashCode is negative, and so is that of each name derived from it
// (the transactional id a processor derives from its group, say). Kafka
// places a group's offsets and a transactional id's state by that hash
// (Utils.abs(hash) % partitions): about half of all names hash negative,
// and code that gets the sign wrong looks in the wrong partition for
// exactly these.
func UniqueNegativeHashName(tb testing.TB, prefix string, derived ...func(string) string) string {
	tb.Helper()
	for range 10_000 {
		name := integration.UniqueName(tb, prefix)
		ok := txnscan.JavaStringHash(name) < 0
		for _, d := range derived {
			ok = ok && txnscan.JavaStringHash(d(name)) < 0
		}
		if ok {
			return name
		}
	}
	tb.Fatalf("testbed: no name with prefix %q hashes negative", prefix)
	return ""
}
