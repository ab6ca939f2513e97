package eoskit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// goList runs go list with args in the module and returns its lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Fields(string(out))
}

// A dependency is linked only into what uses it: a program that imports
// a runner, and not package state/pebblestore, links no pebble (as only
// pgxpool imports puddle); and no package of the library links the test
// beds, the tools, the test-only suites, the users' test kit, or go-jose.
func TestLibraryLinksOnlyWhatItUses(t *testing.T) {
	const mod = "github.com/eoskit/eoskit"
	library := []string{".", "./eos", "./eos/eosprom", "./eos/eoshttp", "./probe", "./state", "./window", "./offsetstore", "./dedup", "./outbox", "./topics", "./verify"}
	for _, pkg := range library {
		for _, dep := range goList(t, "-deps", pkg) {
			switch {
			case strings.HasPrefix(dep, "github.com/cockroachdb/pebble"),
				strings.HasPrefix(dep, "github.com/go-jose/"), // signs the test bed's OAUTHBEARER tokens
				strings.HasPrefix(dep, mod+"/state/pebblestore"),
				strings.HasPrefix(dep, mod+"/testsupport"),
				strings.HasPrefix(dep, mod+"/tools"),
				strings.HasPrefix(dep, mod+"/tests"),
				strings.HasPrefix(dep, mod+"/integration"),
				strings.HasPrefix(dep, mod+"/cmd"),
				dep == "testing":
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
	// The root package is the leaf every runner builds on: the standard
	// library alone (its doc says so).
	for _, dep := range goList(t, "-deps", ".") {
		if first, _, _ := strings.Cut(dep, "/"); strings.Contains(first, ".") && dep != mod {
			t.Errorf("the root package links %s", dep)
		}
	}
	// And the store on disk does link it: the check above can fail.
	var linked bool
	for _, dep := range goList(t, "-deps", "./state/pebblestore") {
		linked = linked || strings.HasPrefix(dep, "github.com/cockroachdb/pebble/")
	}
	if !linked {
		t.Error("state/pebblestore links no pebble package: the check above proves nothing")
	}
}

// internal/ holds only what the library imports: each of its packages is
// imported by a library package, and none imports a tool, a bed, a test
// or a runner (the consume core imported eos for its presets, which now
// live in internal/preset).
func TestInternalHoldsOnlyLibraryInternals(t *testing.T) {
	const mod = "github.com/eoskit/eoskit"
	used := map[string]bool{}
	for _, pkg := range []string{".", "./eos/...", "./state/...", "./offsetstore", "./dedup", "./outbox", "./topics", "./verify", "./integration"} {
		for _, dep := range goList(t, "-deps", pkg) {
			used[dep] = true
		}
	}
	for _, pkg := range goList(t, "./internal/...") {
		if !used[pkg] {
			t.Errorf("%s is in internal/ but no library package imports it", pkg)
		}
		for _, imp := range goList(t, "-f", `{{join .Imports " "}}`, pkg) {
			// Nor a runner: an internal package sits below them all.
			for _, not := range []string{"/testsupport", "/tools", "/tests", "/cmd", "/integration", "/eos", "/offsetstore", "/dedup", "/outbox"} {
				if strings.HasPrefix(imp, mod+not) {
					t.Errorf("%s imports %s", pkg, imp)
				}
			}
		}
	}
}
