package main

import (
	"os/exec"
	"strings"
	"testing"
)

// eoslab is a program users run: it must not link the test harness, the
// testing package, or Docker's client through testcontainers (it did
// while the verifier lived in package integration).
func TestLinksNoTestHarness(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "testing",
			strings.HasPrefix(dep, "github.com/eoskit/eoskit/integration"),
			strings.HasPrefix(dep, "github.com/eoskit/eoskit/testsupport/testbed"),
			strings.Contains(dep, "testcontainers"),
			strings.Contains(dep, "github.com/moby/"),
			strings.Contains(dep, "github.com/docker/"):
			t.Errorf("eoslab links %s", dep)
		}
	}
}
