package dedup_test

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/dedup"
)

func TestMemoryStoreRemembersItsWindowAndNoMore(t *testing.T) {
	m := dedup.NewMemoryStore(3)
	for _, id := range []string{"a", "b", "c"} {
		if !m.Claim("s", id) {
			t.Fatalf("first claim of %s refused", id)
		}
	}
	if m.Claim("s", "a") || m.Claim("s", "c") {
		t.Fatal("a copy within the window was claimed again")
	}
	if !m.Claim("other", "a") {
		t.Fatal("scopes are not separate")
	}
	// "other/a" pushed "s/a" out of the three-id window.
	if !m.Claim("s", "a") {
		t.Fatal("an id older than the window is still remembered; the window is not bounded")
	}
}

func TestStampIsStableAcrossRetries(t *testing.T) {
	r := dedup.Stamp(&kgo.Record{Value: []byte("v")})
	id, ok := dedup.HeaderID(dedup.IDHeader)(r)
	if !ok || len(id) != 36 {
		t.Fatalf("stamped id %q, %v", id, ok)
	}
	dedup.Stamp(r) // a retry path that stamps again must not change the id
	if again, _ := dedup.HeaderID(dedup.IDHeader)(r); again != id || len(r.Headers) != 1 {
		t.Fatalf("restamping changed the id from %s to %s (%d headers)", id, again, len(r.Headers))
	}
	other, _ := dedup.HeaderID(dedup.IDHeader)(dedup.Stamp(&kgo.Record{}))
	if other == id {
		t.Fatal("two messages got the same id")
	}
	if _, ok := dedup.KeyID()(&kgo.Record{}); ok {
		t.Fatal("KeyID found an id in a record without key")
	}
}
