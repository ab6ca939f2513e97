package integration

import "syscall"

// killWithParent asks Linux to SIGKILL the child when its parent dies.
// Linux sends it when the thread that started the child exits, not the
// process: Go does not end its threads, unless a goroutine that called
// runtime.LockOSThread returns without unlocking, so children must not be
// started from such a goroutine.
func killWithParent(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }
