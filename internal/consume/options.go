package consume

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

// Setting sets one of the settings every database runner shares. The
// options of offsetstore and dedup that set them are written here once:
// each package declares the option under its own name and doc, and
// applies the Setting to its config's core.
type Setting func(*Config)

// Brokers adds seed brokers.
func Brokers(addrs ...string) Setting {
	return func(c *Config) { c.Brokers = append(c.Brokers, addrs...) }
}

// Group sets the consumer group.
func Group(g string) Setting { return func(c *Config) { c.Group = g } }

// Topics adds topics to consume.
func Topics(t ...string) Setting {
	return func(c *Config) { c.Topics = append(c.Topics, t...) }
}

// MaxRecordsPerCommit bounds a batch, and so a database transaction.
func MaxRecordsPerCommit(n int) Setting { return func(c *Config) { c.MaxPoll = n } }

// Concurrency sets how many batches commit at once.
func Concurrency(n int) Setting { return func(c *Config) { c.Concurrency = n } }

// DrainTimeout bounds the drain once Run's ctx ended.
func DrainTimeout(d time.Duration) Setting { return func(c *Config) { c.Drain = d } }

// Logger sets the logger; nil keeps the default.
func Logger(l *slog.Logger) Setting {
	return func(c *Config) {
		if l != nil {
			c.Logger = l
		}
	}
}

// Metrics sets where the runner reports.
func Metrics(m eoskit.Metrics) Setting { return func(c *Config) { c.Metrics = m } }

// ClientOptions adds the user's franz-go options.
func ClientOptions(opts ...kgo.Opt) Setting {
	return func(c *Config) { c.ClientOpts = append(c.ClientOpts, opts...) }
}

// InstanceID makes the runner a static group member (KIP-345).
func InstanceID(id string) Setting {
	return func(c *Config) { c.ClientOpts = append(c.ClientOpts, kgo.InstanceID(id)) }
}

// ConsumerProtocol joins with Kafka's consumer group protocol (KIP-848).
func ConsumerProtocol() Setting { return func(c *Config) { c.ConsumerProtocol = true } }
