package outbox

import (
	"errors"
	"testing"

	"github.com/eoskit/eoskit/eos"
)

// A relay fenced with no other relay on its slot restarts (a transaction
// timeout), but not for ever: two relays of different slots sharing a
// transactional id would fence each other at every restart.
func TestLonelyFencesRestartUntilTheyRepeat(t *testing.T) {
	r := &Relay{cfg: &config{names: names{slot: "s"}, txnID: "shared"}}
	fenced := errors.Join(eos.ErrFenced, errors.New("INVALID_PRODUCER_EPOCH"))
	for i := range maxLonelyFences {
		if err := r.lonelyFence(fenced); errors.Is(err, eos.ErrFenced) {
			t.Fatalf("fence %d: %v; want a restart, not ErrFenced", i+1, err)
		}
	}
	if err := r.lonelyFence(fenced); !errors.Is(err, eos.ErrFenced) {
		t.Fatalf("fence %d within %s: %v; want ErrFenced, final", maxLonelyFences+1, lonelyFenceWindow, err)
	}
}
