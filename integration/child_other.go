//go:build !linux

package integration

import "syscall"

// killWithParent does nothing where there is no parent-death signal
// (macOS, Windows): a child outlives a test binary that died without its
// cleanups, and the test's cleanup (Kill) is all that ends it.
func killWithParent(*syscall.SysProcAttr) {}
