package outbox

// BeforeCommit runs fn inside each Kafka transaction (or, at-least-once,
// each batch), after its records and position were produced and its rows
// deleted, just before it commits: where tests stall or crash a relay.
func BeforeCommit(fn func()) Option {
	return func(c *config) { c.hooks.beforeCommit = fn }
}
