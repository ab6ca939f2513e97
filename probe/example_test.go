package probe_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/probe"
)

// A runner that runs but has not been given its assignment yet (after a
// restart, while the group waits out its predecessor) is alive and not
// ready: Kubernetes keeps it, and sends it no traffic.
func ExampleRoutes() {
	health := func() eoskit.Health { return eoskit.Health{Path: "eos", Running: true} } // runner.Health
	mux := http.NewServeMux()
	probe.Routes(mux, health)
	for _, path := range []string{"/healthz", "/readyz"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Println(path, rec.Code)
	}
	// Output:
	// /healthz 200
	// /readyz 503
}
