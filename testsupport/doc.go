// Package testsupport holds no code: its subpackages are eoskit's own test
// beds and embedded servers (testbed, embeddedpg, freeport, groupdesc,
// srctree). The users' kit is package integration, which builds on some of
// them; nothing here is covered by a compatibility promise, and no package
// of the library (eos, state, offsetstore, dedup, outbox, topics, verify)
// imports them.
package testsupport
