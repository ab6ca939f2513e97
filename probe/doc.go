// Package probe answers a runner's probes over HTTP: /healthz a liveness
// probe ([eoskit.Health.Healthy]) and /readyz a readiness probe
// ([eoskit.Health.Ready]), each 200 or 503 with the runner's Health as
// JSON. It serves an eos.Processor, an offsetstore.Runner, a
// dedup.Consumer and an outbox.Relay alike: anything with a Health method.
//
//	mux := http.NewServeMux()
//	probe.Routes(mux, runner.Health)
//	err := probe.Serve(ctx, ":8080", mux, runner.Run) // fails at once if the port is taken
//
// What it guarantees: an answer from the runner's state at the moment of
// the request, never cached; 503 from the moment Run returns (Running is
// false). The JSON holds names of topics and partitions, times, counts
// and the text of the last error, never a record's key or value; the last
// error's text is what the runner's log shows, which can name a topic, a
// group or a database object, so serve it where the probes are, not on a
// public address.
//
// What breaks it: a liveness probe on /readyz (a member waiting to be
// assigned after a restart is alive, and would be killed in a loop); a
// liveness probe's timeout shorter than a rebalance under load, with
// failureThreshold 1; the package doc of eoskit.Health says what each
// field means.
package probe
