package outbox

import (
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/eoskit/eoskit"
)

// maxNameLen bounds an outbox's [Name], so that its longest identifier,
// eoskit_outbox_<name>_dead_letters, fits PostgreSQL's 63 bytes (a longer
// one would be truncated, and two outboxes could end up sharing a table).
const maxNameLen = 63 - len("eoskit_outbox_") - len("_dead_letters")

// suffixes are what an outbox's table name is extended by for the tables
// beside it (its schema version, dead letters, relays' heartbeats and
// slots' tokens). A name that is one of them, or ends with one, would give
// one outbox's table the name of another's table beside it.
var suffixes = []string{"dead_letters", "schema", "relays", "slots"}

// names are one outbox's identifiers in PostgreSQL, all derived from its
// name, except the slot, which [Slot] may choose. The default outbox (no
// name) has the names eoskit always had.
type names struct {
	name  string
	named bool   // Name was given, "" included (which is refused)
	slot  string // set by Slot; "" derives it from the database
}

// check returns an *eoskit.ConfigError unless the names are ones PostgreSQL
// holds as they are: [a-z0-9_], within 63 bytes, and no outbox's table
// named like another's.
func (n names) check() error {
	bad := func(setting, reason string) error {
		return &eoskit.ConfigError{Package: "outbox", Setting: setting, Reason: reason}
	}
	if n.named {
		switch {
		case n.name == "":
			return bad("Name", `an outbox's name can not be empty (leave Name out for the default outbox, "eoskit_outbox")`)
		case len(n.name) > maxNameLen:
			return bad("Name", fmt.Sprintf("%q is %d bytes; at most %d, so that its tables' names fit PostgreSQL's 63", n.name, len(n.name), maxNameLen))
		case !slotChars(n.name):
			return bad("Name", fmt.Sprintf("%q: an outbox's name holds only lower-case letters, digits and _ (it is part of its replication slot's name)", n.name))
		}
		for _, s := range suffixes {
			if n.name == s || strings.HasSuffix(n.name, "_"+s) {
				return bad("Name", fmt.Sprintf("%q: a name can not be or end with _%s (the tables beside an outbox's table end so)", n.name, s))
			}
		}
	}
	if n.slot != "" && !validSlotName(n.slot) {
		return bad("Slot", fmt.Sprintf("%q is not a replication slot name (lower-case letters, digits and _, at most 63)", n.slot))
	}
	return nil
}

// table is the outbox table: eoskit_outbox, or eoskit_outbox_<name>.
func (n names) table() string {
	if n.name == "" {
		return Table
	}
	return Table + "_" + n.name
}

// publication is the publication over the table (inserts only), which the
// relay's stream reads: named like the table.
func (n names) publication() string { return n.table() }

// deadLetters keeps, whole, the records the relay dead-lettered.
func (n names) deadLetters() string { return n.table() + "_dead_letters" }

// schema holds the outbox's schema version.
func (n names) schema() string { return n.table() + "_schema" }

// relays holds the heartbeats of the relays holding the outbox's slots,
// which standbys watch.
func (n names) relays() string { return n.table() + "_relays" }

// slots holds each of the outbox's slots' incarnation token, which its
// positions in Kafka carry.
func (n names) slots() string { return n.table() + "_slots" }

// slotIn is the slot in database db: Slot's, or eoskit_outbox_<db> for
// the default outbox and eoskit_outbox_<name>_<db> for a named one (slot
// names are the server's, so each database's differ; the name first, so
// that a long database name, cut short, does not hide it).
func (n names) slotIn(db string) string {
	switch {
	case n.slot != "":
		return n.slot
	case n.name == "":
		return slotName(Table+"_", db)
	default:
		return slotName(Table+"_"+n.name+"_", db)
	}
}

// slotName makes a valid slot name of prefix (valid already, at most 51
// bytes) and a database name: other characters than a-z, 0-9 and _ as
// _, and, when that changed the name or the whole exceeds 63 bytes, cut
// to 54 with a hash of the database's name at the end, so that databases
// "App" and "app", or "a-b" and "a_b", get slots of their own.
func slotName(prefix, db string) string {
	b := []byte(prefix)
	changed := false
	for _, r := range db {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			b = append(b, byte(r))
		} else {
			b, changed = append(b, '_'), true
		}
	}
	if !changed && len(b) <= 63 {
		return string(b)
	}
	h := fnv.New32a()
	h.Write([]byte(db))
	return fmt.Sprintf("%s_%08x", b[:min(len(b), 54)], h.Sum32())
}

// ident quotes an identifier for SQL.
func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

func slotChars(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

func validSlotName(s string) bool { return s != "" && len(s) <= 63 && slotChars(s) }
