// Package tools holds no code: its subpackages are the programs eoskit's
// developers run (make bench's tools/bench, the chaos suite's
// tools/copier, the scripts' tools/eosdev). No package of the library
// imports them.
package tools
