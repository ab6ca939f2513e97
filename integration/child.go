package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ChildProcess prepares cmd to run as a test's child process: marked with
// [StartedByTestEnv], killed (SIGKILL) if the test binary dies without
// cleaning up (Linux's parent-death signal), and killed when the test ends
// (whoever started it still reaps it with Wait). Start it after this call.
// [StartChild] is this for a re-execution of the test binary itself.
func ChildProcess(tb testing.TB, cmd *exec.Cmd) {
	tb.Helper()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, StartedByTest())
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	killWithParent(cmd.SysProcAttr)
	tb.Cleanup(func() {
		// Kill is safe beside a Wait in another goroutine, and a no-op
		// on a process that exited.
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
	})
}

// StartedByTest returns the variable (name=token) that marks a process as
// started by this test run: [StartedByTestEnv] set to [TestRunEnv]'s token.
func StartedByTest() string { return StartedByTestEnv + "=" + runToken() }

// ChildEnv names, in the environment of a process [StartChild] started,
// the [ChildFunc] it runs.
const ChildEnv = "EOSKIT_CHILD"

// ChildFunc is the main function of a child process: the program under
// test, as it would run in production. Its ctx ends on SIGTERM or SIGINT;
// args are those given to [StartChild].
type ChildFunc func(ctx context.Context, args []string) error

// RunChild, called first in TestMain, makes the test binary a program
// [StartChild] can start: in a process StartChild started it runs the
// function of children registered under the name it was given, and exits
// (0 when the function returns nil; 1 otherwise, the error on standard
// error; 2 for a name children lacks). In the test binary itself (no
// EOSKIT_CHILD in its environment) it returns at once.
func RunChild(children map[string]ChildFunc) {
	name, ok := os.LookupEnv(ChildEnv)
	if !ok {
		return
	}
	main := children[name]
	if main == nil {
		fmt.Fprintf(os.Stderr, "integration: no child %q is registered with RunChild\n", name)
		os.Exit(2)
	}
	var args []string
	if i := slices.Index(os.Args, "--"); i >= 0 {
		args = os.Args[i+1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := main(ctx, args)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: child %s: %v\n", name, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Child is a process [StartChild] started.
type Child struct {
	name string
	cmd  *exec.Cmd
	out  *LogBuffer
	done chan struct{} // closed once the process exited
	err  error         // what Wait returned, once done is closed
}

// childTimeout bounds the wait for a child to exit once it was killed.
const childTimeout = 30 * time.Second

// StartChild starts the test binary again as a child process that runs
// the [ChildFunc] registered under name with [RunChild] (in TestMain), with
// args: so that a test crashes its own program with [Child.Kill], as a
// power loss or the OOM killer would, and starts it again. The child is a
// [ChildProcess]: it does not outlive tb. Its output (standard output and
// error) is kept, and logged when tb fails.
func StartChild(tb testing.TB, name string, args ...string) *Child {
	tb.Helper()
	return StartChildFiles(tb, name, nil, args...)
}

// StartChildFiles is [StartChild] with files open in the child as its
// descriptors 3, 4, and so on (os/exec's ExtraFiles): a listening
// socket's (net.TCPListener.File), say, so that the child serves on a
// port the test holds across the child's restarts, and no other process
// takes it meanwhile. The child reads it with os.NewFile(3, name) and
// net.FileListener; the test may close its files once this returns.
func StartChildFiles(tb testing.TB, name string, files []*os.File, args ...string) *Child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.ExtraFiles = files
	cmd.Env = append(os.Environ(), ChildEnv+"="+name)
	c := &Child{name: name, cmd: cmd, out: &LogBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	ChildProcess(tb, cmd)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("integration: start child %s: %v", name, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("integration: child %s's output:\n%s", name, tail(c.out.String(), 50))
		}
	})
	return c
}

// Kill sends the child SIGKILL and returns once it is gone. It returns an
// error when the child had exited before (it crashed, or RunChild is not
// called in TestMain), with the end of its output.
func (c *Child) Kill() error {
	select {
	case <-c.done:
		return fmt.Errorf("integration: child %s exited before it was killed (%v); its last lines:\n%s", c.name, c.err, tail(c.out.String(), 30))
	default:
	}
	_ = c.cmd.Process.Kill()
	if err := c.wait(childTimeout, "after SIGKILL"); err != nil {
		return err
	}
	// It may have exited on its own between the look above and the kill:
	// only a death by SIGKILL is the crash the test asked for.
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("integration: child %s exited before it was killed (%v); its last lines:\n%s", c.name, c.err, tail(c.out.String(), 30))
	}
	return nil
}

// Stop sends the child SIGTERM, as a deployment stops a program, and
// waits up to timeout for it to exit; then it kills it and returns an
// error. It returns the child's error (with the end of its output) when
// the child exits with another status than 0.
func (c *Child) Stop(timeout time.Duration) error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	if err := c.wait(timeout, "after SIGTERM"); err != nil {
		_ = c.cmd.Process.Kill()
		return err
	}
	if c.err != nil {
		return fmt.Errorf("integration: child %s: %w; its last lines:\n%s", c.name, c.err, tail(c.out.String(), 30))
	}
	return nil
}

// Done is closed once the child exited, killed or not: a test waiting on
// it fails at once, with [Child.Output], rather than at its deadline.
func (c *Child) Done() <-chan struct{} { return c.done }

// Output returns what the child wrote so far.
func (c *Child) Output() string { return c.out.String() }

func (c *Child) wait(timeout time.Duration, what string) error {
	select {
	case <-c.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("integration: child %s still runs %v %s", c.name, timeout, what)
	}
}

// tail returns the last max lines of s.
func tail(s string, max int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > max {
		lines = lines[len(lines)-max:]
	}
	return strings.Join(lines, "\n")
}
