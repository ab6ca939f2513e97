package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// Without -instance the command refuses to start, saying why, rather than
// take the host name, which changes at every restart in a Deployment or a
// container and with it the transactional id (issue 47 item 5; on
// 3bfa998 it started with the host name).
func TestInstanceIsRequired(t *testing.T) {
	bin := t.TempDir() + "/kafkatokafka"
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-brokers", "127.0.0.1:1").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "-instance is required") {
		t.Fatalf("without -instance: %v\n%s\nwant exit 2 saying -instance is required", err, out)
	}
}
