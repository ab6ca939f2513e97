package outbox

import (
	"errors"
	"testing"
)

// verified passes what ends below Kafka's position, and at it only the
// transaction the position names (its id and commit time); anything else
// there, or a first transaction past it, is a rewound log.
func TestVerifiedTellsARewoundLog(t *testing.T) {
	pos := published{end: 1000, xid: 7, committed: 555}
	for _, c := range []struct {
		name    string
		txns    []dbTxn
		rewound bool
	}{
		{"below, then the one Kafka holds", []dbTxn{{end: 900, xid: 6, committed: 1}, {end: 1000, xid: 7, committed: 555}, {end: 1100, xid: 8}}, false},
		{"another id at the position", []dbTxn{{end: 1000, xid: 9, committed: 555}}, true},
		{"the same id, another commit time (a restored server reuses ids)", []dbTxn{{end: 1000, xid: 7, committed: 556}}, true},
		{"none ends there", []dbTxn{{end: 900, xid: 6}, {end: 1200, xid: 7, committed: 555}}, true},
	} {
		s := &stream{slot: "s"}
		s.verifyAt(pos, 10, nil)
		var err error
		for i := range c.txns {
			if err = s.verified(&c.txns[i]); err != nil {
				break
			}
		}
		if got := errors.Is(err, ErrRewound); got != c.rewound {
			t.Errorf("%s: err %v, want rewound %v", c.name, err, c.rewound)
		}
		if !c.rewound && s.verify != nil {
			t.Errorf("%s: still verifying after the position passed", c.name)
		}
		if c.rewound && (s.verify == nil || s.hold != 10) {
			t.Errorf("%s: a rewound log no longer holds the slot at its resume point", c.name)
		}
	}
	// A position written before commit times were kept: the id alone.
	s := &stream{slot: "s"}
	s.verifyAt(published{end: 1000, xid: 7}, 10, nil)
	if err := s.verified(&dbTxn{end: 1000, xid: 7, committed: 999}); err != nil {
		t.Errorf("a position without a commit time: %v", err)
	}
}
