package integration

import (
	"os"
	"testing"

	"github.com/eoskit/eoskit/eostest"
)

// RequireServicesEnv is the environment variable that turns a missing
// service from a skip into a test failure. `make test` sets it to 1.
const RequireServicesEnv = eostest.RequireServicesEnv

// servicesRequired reports whether a missing service must fail the test.
func servicesRequired() bool { return os.Getenv(RequireServicesEnv) == "1" }

// missingService skips tb, or fails it when services are required, with a
// message that says how to get the service.
func missingService(tb testing.TB, service, how string, cause error) {
	tb.Helper()
	msg := "integration: no " + service + " available (" + cause.Error() + "). " + how
	if servicesRequired() {
		tb.Fatal(msg + " [" + RequireServicesEnv + "=1, so this is a failure, not a skip]")
	}
	tb.Skip(msg)
}
