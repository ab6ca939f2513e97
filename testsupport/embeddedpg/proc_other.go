//go:build !linux

package embeddedpg

import (
	"os"
	"syscall"
)

// supported is false: the server's cleanup rests on Linux's parent-death
// signal, and only Linux binaries are pinned.
const supported = false

type account struct{ name string }

func serverAccount() (account, error)      { return account{}, nil }
func (account) attr() *syscall.SysProcAttr { return nil }
func (account) own(string) error           { return nil }
func (account) ownFile(*os.File) error     { return nil }
func alive(int) bool                       { return true }
func killLeftover(string)                  {}

// oNoFollow is none where the server does not run (Start refuses first).
const oNoFollow = 0
