//go:build unix

package eos_test

import "syscall"

// pauseSignal stops a process where it stands, and wakeSignal resumes it:
// a zombie past its session timeout (TestAStandbyTakesOverAKilledInstancesPartitionsWithTheTail).
var pauseSignal, wakeSignal syscall.Signal = syscall.SIGSTOP, syscall.SIGCONT
