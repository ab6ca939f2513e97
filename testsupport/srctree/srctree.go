// Package srctree finds files of the eoskit source tree (its scripts) from
// a program or test running inside it. It imports no testing, so tools and
// test helpers alike can use it.
package srctree

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
)

// Find walks up from the working directory (a test runs in its package's
// folder, go run in the caller's) to the eoskit module root and returns
// rel under it, or an error if there is no such file or no module root.
func Find(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(mod, []byte("module github.com/eoskit/eoskit\n")) {
			p := filepath.Join(dir, rel)
			if _, err := os.Stat(p); err != nil {
				return "", err
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the eoskit source tree")
		}
		dir = parent
	}
}
