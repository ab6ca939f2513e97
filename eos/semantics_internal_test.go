package eos

import (
	"testing"

	"github.com/eoskit/eoskit/internal/preset"
)

// eos.Semantics is internal/preset's under its public name: the values
// must stay the same, or the database runners' exactly-once preset would
// be another one than eos's.
func TestSemanticsAreThePresets(t *testing.T) {
	for s, p := range map[Semantics]preset.Semantics{AtMostOnce: preset.AtMostOnce, AtLeastOnce: preset.AtLeastOnce, ExactlyOnce: preset.ExactlyOnce} {
		if preset.Semantics(s) != p || s.String() != p.String() {
			t.Errorf("eos %s is preset %s", s, p)
		}
	}
}
