// Package verify checks what a run of a pipeline produced against what it
// was fed, for lost, duplicated, aborted-but-visible and reordered
// records: the verifier behind every exactly-once claim eoskit makes.
//
// It imports neither testing nor any container library, so programs
// (cmd/eoslab, the chaos copier, a user's own soak test) use it as tests
// do; eoskit's test harness, package integration, builds on it.
//
// # The copy workload
//
// A copier writes, for each input record, an output whose value is
// [CopyValue] of it: the input's id, partition and offset. [DecodeOutputs]
// (from a topic) and [ReadRows] (from a table) turn outputs back into
// [Output]s, and [Check] compares them with the inputs:
//
//	outs, _ := verify.DecodeOutputs(committed)
//	rep := verify.Check(verify.Run{Input: ids, Output: outs, Aborted: verify.AbortedPositions(raw)})
//	if err := rep.Err(); err != nil { ... }
//
// An output in a position an aborted transaction wrote counts as
// aborted-visible; so does any output of an input id that only aborted
// transactions wrote (Run.AbortedInput). Per input stream (partition),
// outputs must appear in input order within each output partition.
package verify
