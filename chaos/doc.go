// Package chaos is eoskit's chaos suite: copiers for each exactly-once path
// (internal/cmd/copier) run as separate OS processes while the suite kills
// (SIGKILL), stops (SIGTERM), pauses (SIGSTOP past the session timeout, then
// SIGCONT) and replaces them, stalls the busiest owner until the others
// have taken its partitions and then wakes it, and kills or restarts the
// broker and
// PostgreSQL; the verifier then checks the output, and a read_committed
// reader that ran concurrently must have seen a prefix of the final output.
//
// make test runs one scenario per path; make chaos runs the full matrix and
// prints its table. The package holds tests only.
package chaos
