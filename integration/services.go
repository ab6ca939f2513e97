package integration

import (
	"os"
	"testing"
)

// The environment variables this package reads.
const (
	// KafkaBrokersEnv names a running broker's bootstrap addresses
	// (host:port[,host:port]); when set, [Kafka] uses them.
	KafkaBrokersEnv = "KAFKA_BROKERS"
	// DatabaseURLEnv names a running PostgreSQL (a postgres:// URL of a
	// role that may create databases); when set, [Postgres] uses it.
	DatabaseURLEnv = "DATABASE_URL"
	// RequireServicesEnv, set to 1, turns "no service, test skipped" into
	// a failure. Set it in CI, so that a suite can not pass by skipping.
	RequireServicesEnv = "EOS_REQUIRE_SERVICES"
	// KafkaImageEnv names the Kafka image to run (default
	// [DefaultKafkaImage]).
	KafkaImageEnv = "EOSKIT_KAFKA_IMAGE"
	// PostgresImageEnv names the PostgreSQL image to run (default
	// [DefaultPostgresImage]).
	PostgresImageEnv = "EOSKIT_POSTGRES_IMAGE"
	// DockerNetworkEnv set to "host" runs containers on the host's network
	// (see [WithHostNetwork]).
	DockerNetworkEnv = "EOSKIT_DOCKER_NETWORK"
	// TestRunEnv holds the token of the current test run: the value of
	// [Label] on every container, and of [StartedByTestEnv] in every child
	// process, so that a CI run finds what its own tests left behind. "1"
	// when unset.
	TestRunEnv = "EOSKIT_TEST_RUN"
	// StartedByTestEnv marks, in its environment, every process a test
	// starts through [ChildProcess] or [StartChild], with the run's token.
	StartedByTestEnv = "EOSKIT_STARTED_BY_TEST"
)

const (
	kafkaHowTo = "Set " + KafkaBrokersEnv + " to a running broker's address (in eoskit's tree: `scripts/kafka.sh start` prints one), " +
		"or start Docker (a container is run then)."
	postgresHowTo = "Set " + DatabaseURLEnv + " to a running PostgreSQL whose role may create databases (in eoskit's tree: `scripts/postgres.sh start` prints one), " +
		"or start Docker (a container is run then)."
)

// ServicesRequired reports whether a missing service must fail the test
// rather than skip it: EOS_REQUIRE_SERVICES=1.
func ServicesRequired() bool { return os.Getenv(RequireServicesEnv) == "1" }

// ServiceMissing skips tb, or fails it when [ServicesRequired], for a
// service that could not be had, saying why (cause) and how to get it.
func ServiceMissing(tb testing.TB, service, how string, cause error) {
	tb.Helper()
	msg := "integration: no " + service + " available (" + cause.Error() + "). " + how
	if ServicesRequired() {
		tb.Fatal(msg + " [" + RequireServicesEnv + "=1, so this is a failure, not a skip]")
	}
	tb.Skip(msg)
}

// runToken is the run's token: [TestRunEnv], else "1".
func runToken() string {
	if token := os.Getenv(TestRunEnv); token != "" {
		return token
	}
	return "1"
}
