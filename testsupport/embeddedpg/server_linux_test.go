package embeddedpg_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/eoskit/eoskit/testsupport/embeddedpg"
)

// Run as root (as CI is), the server runs as nobody, and nobody owns only
// the cluster's data/: the directory where root writes (the password file,
// server.log) stays root's and writable by root alone, so that a process
// running as nobody cannot plant a link there and have root write, or
// hand over, a file of its choosing. Before, the whole directory was
// given to nobody (issue 47 item 16, failing on 3bfa998). The property is
// root's: as another user the server runs as that user, and there is no
// one to guard against.
func TestRootKeepsTheClusterDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the server runs as the caller: nothing to guard against unless the caller is root")
	}
	srv := start(t)
	defer srv.Stop()
	dir := embeddedpg.Dir(srv)
	owner := func(path string) (uint32, os.FileMode) {
		t.Helper()
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Uid, fi.Mode()
	}
	if uid, mode := owner(dir); uid != 0 || mode.Perm()&0o022 != 0 {
		t.Fatalf("the cluster's directory is uid %d, mode %s: want root's, writable by root alone", uid, mode)
	}
	if uid, _ := owner(filepath.Join(dir, "data")); uid == 0 {
		t.Fatal("data/ is root's: the server's user could not write its cluster")
	}
	if uid, mode := owner(filepath.Join(dir, "server.log")); uid != 0 || !mode.IsRegular() {
		t.Fatalf("server.log is uid %d, mode %s: want a regular file of root's", uid, mode)
	}
	if _, err := os.Lstat(filepath.Join(dir, "pwfile")); !os.IsNotExist(err) {
		t.Fatalf("the password file is left after initdb: %v", err)
	}
}
