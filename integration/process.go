package integration

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// StartedByTestEnv marks, in its environment, every process a test starts
// (private brokers, copier and loader processes), so that `make test` can
// check at its end that none outlived the tests (scripts/leftovers.sh).
const StartedByTestEnv = "EOSKIT_STARTED_BY_TEST"

// ChildProcess prepares cmd to run as a test's child process: marked with
// StartedByTestEnv, killed (SIGKILL) if the test binary dies without
// cleaning up (Linux's parent-death signal), and killed when the test ends
// (whoever started it still reaps it with Wait). Start it after this call.
func ChildProcess(tb testing.TB, cmd *exec.Cmd) {
	tb.Helper()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, StartedByTestEnv+"=1")
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	tb.Cleanup(func() {
		// Kill is safe beside a Wait in another goroutine, and a no-op
		// on a process that exited.
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
	})
}
