// Package window assigns records to event-time windows, as Kafka Streams'
// TimeWindows do, and decides when a window closes and when it expires.
// It holds no state: the windowed aggregations of package eos
// ([github.com/eoskit/eoskit/eos.WindowedCount] and its kin) keep their
// windows in a processor's keyed state, whose changelog commits in the
// processor's transaction.
//
// # Time
//
// A record's time is its event time: the record's timestamp, or what the
// aggregation's extractor returns. Each input partition keeps its stream
// time, the largest record time it has seen (a late record does not move
// it back). Stream time, not the wall clock, decides what is late and
// what expires, so a backlog replayed gives the same windows as the live
// stream did.
//
// # Windows
//
// A [Spec] of Size and Advance lays windows [start, start+Size) whose
// starts are the multiples of Advance since the Unix epoch: tumbling when
// Advance is Size (each time in one window), hopping when Advance is less
// (each time in Size/Advance windows, rounded up, at most
// [MaxWindowsPerRecord]). A window takes records
// until stream time reaches its end plus Grace ([Spec.Closed]); a record
// all of whose windows are closed is late: it changes none of them. A
// window is kept until stream time reaches its start plus Retention
// ([Spec.Expired]), at least Size + Grace, so that a window leaves the
// store only once it is closed.
//
// # What breaks it
//
//   - A record time far in the future moves stream time there: every
//     window before it closes at once, and the records that follow, with
//     their true times, are late. Validate times in the extractor
//     (return an error: the record's fault) if a producer's clock can
//     jump.
//   - Stream time is per input partition: a partition that receives
//     nothing keeps its windows open, whatever the others see.
//   - A record without a timestamp (before the Unix epoch) has no window:
//     the aggregations refuse it as the record's fault.
package window
