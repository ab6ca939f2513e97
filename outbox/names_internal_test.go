package outbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/eoskit/eoskit"
)

// Slot names are per server: databases whose names differ only in case or
// in characters a slot name can not hold get slots of their own, as do
// the outboxes of one database, and every name is valid.
func TestSlotNamesOfDistinctDatabasesAndOutboxesDiffer(t *testing.T) {
	dbs := []string{"app", "App", "a-b", "a_b", "a b", strings.Repeat("x", 63), strings.Repeat("x", 64), "é", "_"}
	outboxes := []names{{}, {name: "billing", named: true}, {name: strings.Repeat("n", maxNameLen), named: true}}
	seen := map[string]string{}
	for _, n := range outboxes {
		for _, db := range dbs {
			s := n.slotIn(db)
			if !validSlotName(s) {
				t.Errorf("outbox %q in database %q: slot %q, not a valid slot name", n.name, db, s)
			}
			if n.name != "" && !strings.HasPrefix(s, "eoskit_outbox_"+n.name+"_") {
				t.Errorf("outbox %q in database %q: slot %q does not show the outbox's name", n.name, db, s)
			}
			who := n.name + " in " + db
			if other, ok := seen[s]; ok {
				t.Errorf("%s and %s share slot %q", other, who, s)
			}
			seen[s] = who
		}
	}
}

// The default outbox keeps the names eoskit always gave it, so that
// existing deployments go on; a named one's are derived from its name, and
// fit PostgreSQL's 63 bytes.
func TestOutboxNames(t *testing.T) {
	var def names
	if got := []string{def.table(), def.publication(), def.deadLetters(), def.schema(), def.slotIn("app")}; strings.Join(got, " ") !=
		"eoskit_outbox eoskit_outbox eoskit_outbox_dead_letters eoskit_outbox_schema eoskit_outbox_app" {
		t.Fatalf("the default outbox's names: %v", got)
	}
	long := names{name: strings.Repeat("x", maxNameLen), named: true}
	if err := long.check(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{long.table(), long.deadLetters(), long.schema(), long.slotIn(strings.Repeat("d", 63))} {
		if len(id) > 63 {
			t.Errorf("%s is %d bytes", id, len(id))
		}
	}
}

// A name PostgreSQL would truncate, a slot can not hold, or one that
// would give an outbox's table the name of another's table beside it, is
// refused as an *eoskit.ConfigError naming the option.
func TestMalformedNamesAreRefused(t *testing.T) {
	for _, tc := range []struct {
		n       names
		setting string
	}{
		{names{name: "", named: true}, "Name"},
		{names{name: "Billing", named: true}, "Name"},
		{names{name: "bill-ing", named: true}, "Name"},
		{names{name: "billing;drop", named: true}, "Name"},
		{names{name: strings.Repeat("x", maxNameLen+1), named: true}, "Name"},
		{names{name: "dead_letters", named: true}, "Name"},
		{names{name: "billing_dead_letters", named: true}, "Name"},
		{names{name: "billing_schema", named: true}, "Name"},
		{names{name: "relays", named: true}, "Name"},
		{names{name: "slots", named: true}, "Name"},
		{names{slot: "Slot"}, "Slot"},
		{names{slot: strings.Repeat("s", 64)}, "Slot"},
	} {
		err := tc.n.check()
		cerr, ok := errors.AsType[*eoskit.ConfigError](err)
		if !ok || cerr.Setting != tc.setting || !errors.Is(err, eoskit.ErrInvalidConfig) {
			t.Errorf("%+v: %v; want an *eoskit.ConfigError naming %s", tc.n, err, tc.setting)
		}
	}
	for _, ok := range []string{"billing", "orders_v2", "2fa", "dead", "letters", "x_slot"} {
		if err := (names{name: ok, named: true}).check(); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}
