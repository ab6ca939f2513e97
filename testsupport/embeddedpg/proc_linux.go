package embeddedpg

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

const supported = true

// account is the user initdb and the server run as: the caller itself, or
// nobody when the caller is root (PostgreSQL refuses to run as root).
type account struct {
	name string
	cred *syscall.Credential // nil: the caller's own
}

func serverAccount() (account, error) {
	if os.Geteuid() != 0 {
		name := "the current user"
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
		return account{name: name}, nil
	}
	uid, gid := uint32(65534), uint32(65534)
	if u, err := user.Lookup("nobody"); err == nil {
		id, err1 := strconv.ParseUint(u.Uid, 10, 32)
		g, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return account{}, fmt.Errorf("embeddedpg: user nobody: %w", err)
		}
		uid, gid = uint32(id), uint32(g)
	}
	// Groups left empty clears root's supplementary groups.
	return account{name: "nobody", cred: &syscall.Credential{Uid: uid, Gid: gid}}, nil
}

// attr puts a child in its own process group (a Ctrl-C in the terminal
// reaches the caller, who stops the server in order) and has the kernel
// kill it when the caller dies, however it dies.
func (a account) attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: a.cred}
}

// ownFile gives the open file f to the account.
func (a account) ownFile(f *os.File) error {
	if a.cred == nil {
		return nil
	}
	return f.Chown(int(a.cred.Uid), int(a.cred.Gid))
}

// own gives path to the account.
func (a account) own(path string) error {
	if a.cred == nil {
		return nil
	}
	return os.Chown(path, int(a.cred.Uid), int(a.cred.Gid))
}

// alive reports whether process pid exists (one of another user's counts).
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// killLeftover kills the postmaster of the cluster in dir if one still runs
// (its parent-death signal should have ended it): only a process whose
// command line names dir, so that a reused pid is left alone.
func killLeftover(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	pid, err := strconv.Atoi(string(line))
	if err != nil || pid <= 0 {
		return
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err == nil && namesCluster(cmdline, dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// oNoFollow makes an open fail on a link.
const oNoFollow = syscall.O_NOFOLLOW
