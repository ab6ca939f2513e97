// Package eoskit holds the types every eoskit runner shares: an eos
// Processor, an offsetstore Runner, a dedup Consumer and an outbox Relay
// all report to one [Metrics], show one [Health], stop on a record with
// one *[RecordError], end on a missing ACL with one *[AuthorizationError],
// refuse a configuration with one *[ConfigError] (wrapping
// [ErrInvalidConfig]) and refuse a second Run with [ErrRunning]. The
// three consuming runners take one [ErrorPolicy] for a record whose
// handler failed ([Stop], [Retry], [Classify] and its rules; each
// runner's own DeadLetter), decided by one rule for all three.
//
// Each is declared here once, so that `go doc` shows its fields and
// methods wherever it is used, and errors.Is and errors.As match it
// whichever runner returned it:
//
//	err := r.Run(ctx) // r: an eos.Processor, offsetstore.Runner, dedup.Consumer or outbox.Relay
//	if rerr, ok := errors.AsType[*eoskit.RecordError](err); ok {
//		log.Printf("stopped at %s[%d]@%d: %v", rerr.Topic, rerr.Partition, rerr.Offset, rerr.Err)
//	}
//
// The runners themselves live in the packages eos (Kafka to Kafka),
// offsetstore and dedup (Kafka to PostgreSQL) and outbox (PostgreSQL to
// Kafka). This package imports none of them, nor anything outside the
// standard library: it is the leaf they all build on.
package eoskit
