//go:build !unix

package eos_test

import "syscall"

// pauseSignal and wakeSignal do not exist here (see pause_unix_test.go):
// the zombie's test is Linux's, as every real-broker test.
var pauseSignal, wakeSignal syscall.Signal = -1, -1
