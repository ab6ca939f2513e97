// Package probe answers a runner's probes over HTTP: /livez while Run runs
// (a liveness probe), /healthz while it also makes progress
// ([eoskit.Health.Healthy]: for alerts and dashboards), /readyz while it is
// also assigned its work and restores no keyed state
// ([eoskit.Health.Ready]: a readiness probe), each
// 200 or 503 with the runner's Health as JSON. It serves an eos.Processor,
// an offsetstore.Runner, a dedup.Consumer and an outbox.Relay alike:
// anything with a Health method.
//
//	mux := http.NewServeMux()
//	probe.Routes(mux, runner.Health)
//	err := probe.Serve(ctx, ":8080", mux, runner.Run) // fails at once if the port is taken
//
// What it guarantees: an answer from the runner's state at the moment of
// the request, never cached; answers while the runner drains after ctx
// ends (Serve stops serving when Run returns). The JSON is the Health:
// names of topics, partitions and groups, times, counts, and the last
// error's text as the logs print it (cut to 300 bytes), which quotes what
// the error quotes (a handler's error may quote its record): serve it
// where the probes are, not on a public address.
//
// What breaks it: a liveness probe on /healthz or /readyz. A runner riding
// out an outage of Kafka or PostgreSQL is not Healthy until it commits
// again, and a member waiting for its assignment after a restart, or
// restoring its state (a memory store reads its whole changelog after
// every assignment), is not Ready; a restart cures neither, and killing
// the pod in a loop delays both. Point liveness at /livez.
package probe
