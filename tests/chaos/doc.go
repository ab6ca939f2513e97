// Package chaos is eoskit's chaos suite: copiers for each exactly-once path
// (tools/copier) run as separate OS processes while the suite kills
// (SIGKILL), stops (SIGTERM), pauses (SIGSTOP past the session timeout, then
// SIGCONT) and replaces them, stalls the busiest owner until the others
// have taken its partitions and then wakes it, and kills or restarts the
// broker and
// PostgreSQL; the verifier then checks the output, and a read_committed
// reader that ran concurrently must have seen a prefix of the final output.
//
// The counting paths (count-memory, count-pebble) count the input by key
// with keyed state (eos.Count, its store restored from a changelog written
// in the transaction, one update per changed key per transaction); they
// also face a rebalance while a partition restores. Their check reads the
// updates and the changelog back read_committed: each key's counts only
// grow, none of an aborted transaction is visible, and each key ends at the
// true count of its committed inputs (pebble: the stores left on disk equal
// the changelog). count-naive, counting outside the transaction, is the
// negative control, which must fail that check.
//
// make test runs one scenario per path, side by side (each on a broker of
// its own); make chaos runs the full matrix, one scenario after another,
// and prints its table. The package holds tests only.
package chaos
