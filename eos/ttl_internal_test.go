package eos

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/eoskit/eoskit/state"
)

// Under TTL a handler cannot write eoskit's reserved keys (a record keyed
// with the stream-time key would otherwise corrupt it), nor see them; a
// stamp that is not a time leaves its key alive and is stamped anew by
// the sweep; a stamp whose key is gone is deleted alone, with no
// tombstone for the key.
func TestTTLKVGuardsItsOwnKeys(t *testing.T) {
	tx := state.NewTxn(state.NewMemory(), 0)
	sc := tx.Scope()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	kv := &ttlKV{kv: sc, now: now, ttl: time.Minute}
	for _, key := range []string{streamTimeKey, ttlPrefix + "a"} {
		if err := kv.Put([]byte(key), []byte("9999999999999")); !errors.Is(err, errReservedTTL) {
			t.Errorf("Put(%q) = %v, want errReservedTTL", key, err)
		}
		if err := kv.Delete([]byte(key)); !errors.Is(err, errReservedTTL) {
			t.Errorf("Delete(%q) = %v, want errReservedTTL", key, err)
		}
	}
	if err := kv.Put([]byte("a"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := kv.Get([]byte(ttlPrefix + "a")); ok {
		t.Error("the handler sees a's stamp")
	}
	// A corrupt stamp: a stays; the sweep stamps it at now.
	if err := sc.Put([]byte(ttlPrefix+"a"), []byte("not a time")); err != nil {
		t.Fatal(err)
	}
	later := &ttlKV{kv: sc, now: now.Add(time.Hour), ttl: time.Minute}
	if _, ok, err := later.Get([]byte("a")); !ok || err != nil {
		t.Fatalf("Get(a) with a corrupt stamp: %v, %v; want it there", ok, err)
	}
	// An orphan stamp.
	if err := sc.Put([]byte(ttlPrefix+"gone"), []byte("0")); err != nil {
		t.Fatal(err)
	}
	if err := sweepTTL(sc, now.Add(time.Hour), time.Minute); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := sc.Get([]byte(ttlPrefix + "a")); string(v) != strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10) {
		t.Errorf("a's stamp after the sweep: %q, want the sweep's time", v)
	}
	sc.Keep()
	for _, r := range tx.Dirty() {
		if string(r.Key) == "gone" {
			t.Errorf("the sweep wrote %q for a key that never was", r.Key)
		}
	}
	if _, ok, _ := sc.Get([]byte(ttlPrefix + "gone")); ok {
		t.Error("the orphan stamp survived the sweep")
	}
}
