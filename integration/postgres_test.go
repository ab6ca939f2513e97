package integration_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/eoskit/eoskit/integration"
)

// With no DATABASE_URL and no Docker engine, PostgresServer falls back to
// an embedded server: the test of one database per test passes there, in
// a child test binary whose environment has neither (a bogus DOCKER_HOST;
// testcontainers keeps what it found for the life of a process).
func TestPostgresServerFallsBackToAnEmbeddedServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute) // a first run downloads the binaries
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPostgresGivesEachTestItsOwnDatabase$", "-test.v", "-test.count=1")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, integration.DatabaseURLEnv+"=") && !strings.HasPrefix(kv, "DOCKER_HOST=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "DOCKER_HOST=unix:///nonexistent/docker.sock", "EOS_REQUIRE_SERVICES=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestPostgresGivesEachTestItsOwnDatabase") || !strings.Contains(string(out), "embedded PostgreSQL") {
		t.Fatalf("the child with neither DATABASE_URL nor Docker: %v\n%s", err, out)
	}
}
