package integration

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// StartedByTestEnv marks, in its environment, every process a test starts
// (private brokers, copier and loader processes), with the run's token from
// TestRunEnv, so that `make test` can check at its end that none outlived
// the tests (scripts/leftovers.sh), leaving other runs' processes alone.
const StartedByTestEnv = "EOSKIT_STARTED_BY_TEST"

// TestRunEnv holds the token of the current test run (scripts/test.sh sets
// it); "1" when unset.
const TestRunEnv = "EOSKIT_TEST_RUN"

// startedByTest is the marker a test's child process carries.
func startedByTest() string {
	token := os.Getenv(TestRunEnv)
	if token == "" {
		token = "1"
	}
	return StartedByTestEnv + "=" + token
}

// ChildProcess prepares cmd to run as a test's child process: marked with
// StartedByTestEnv, killed (SIGKILL) if the test binary dies without
// cleaning up (Linux's parent-death signal), and killed when the test ends
// (whoever started it still reaps it with Wait). Start it after this call.
func ChildProcess(tb testing.TB, cmd *exec.Cmd) {
	tb.Helper()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, startedByTest())
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Linux sends it when the thread that started the child exits, not
	// the process: Go does not end its threads, unless a goroutine that
	// called runtime.LockOSThread returns without unlocking, so children
	// must not be started from such a goroutine.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	tb.Cleanup(func() {
		// Kill is safe beside a Wait in another goroutine, and a no-op
		// on a process that exited.
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
	})
}
