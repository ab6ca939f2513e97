package outbox

import "time"

// StatusInterval sets how often a relay reports to PostgreSQL (default
// 10s); a standby takes over from a holder silent for three of them.
func StatusInterval(d time.Duration) Option {
	return func(c *config) { c.statusInterval = d }
}

// BeforeCommit runs fn inside each Kafka transaction (or, at-least-once,
// each batch), after its records and position were produced and its rows
// deleted, just before it commits: where tests stall or crash a relay.
func BeforeCommit(fn func()) Option {
	return func(c *config) { c.hooks.beforeCommit = fn }
}
