package eostest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/log"
)

// The environment variables this package reads.
const (
	// KafkaBrokersEnv names a running broker's bootstrap addresses
	// (host:port[,host:port]); when set, [Kafka] returns them.
	KafkaBrokersEnv = "KAFKA_BROKERS"
	// DatabaseURLEnv names a running PostgreSQL (a postgres:// URL); when
	// set, [Postgres] returns it.
	DatabaseURLEnv = "DATABASE_URL"
	// RequireServicesEnv, set to 1, turns "no service, test skipped" into
	// a failure.
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
	// RunLabelEnv, when set, is the value of the label [Label] on every
	// container this package starts, so that a CI run can find what its
	// tests left behind; "1" otherwise.
	RunLabelEnv = "EOSKIT_TEST_RUN"
)

// Default images: the releases eoskit's guarantees are proven on.
const (
	DefaultKafkaImage    = "apache/kafka:4.4.0"
	DefaultPostgresImage = "postgres:15"
)

// Label is set on every container this package starts (its value: see
// [RunLabelEnv]).
const Label = "org.eoskit.eostest"

// ErrNoDocker is returned (wrapped) by [RunKafka] and [RunPostgres] when no
// Docker engine answers: the one case [Kafka] and [Postgres] treat as "no
// service" rather than as a failure.
var ErrNoDocker = errors.New("eostest: no Docker engine answers")

// startTimeout bounds the start of the containers of one call.
const startTimeout = 3 * time.Minute

// Kafka returns the bootstrap addresses of a real Apache Kafka broker for
// tb: KAFKA_BROKERS when it is set, else a container started for tb and
// terminated when tb ends. With neither env nor Docker it skips tb (fails
// it with EOS_REQUIRE_SERVICES=1); a container that does not come up fails
// tb.
func Kafka(tb testing.TB) []string {
	tb.Helper()
	if s := strings.TrimSpace(os.Getenv(KafkaBrokersEnv)); s != "" {
		brokers := strings.Split(s, ",")
		for i := range brokers {
			brokers[i] = strings.TrimSpace(brokers[i])
		}
		return brokers
	}
	return StartKafka(tb).Brokers()
}

// Postgres returns the URL of a real PostgreSQL for tb: DATABASE_URL when
// it is set, else a container started for tb and terminated when tb ends.
// The container's role (eoskit, password eoskit) may create databases. It
// skips or fails like [Kafka].
func Postgres(tb testing.TB) string {
	tb.Helper()
	if s := os.Getenv(DatabaseURLEnv); s != "" {
		return s
	}
	return StartPostgres(tb).URL()
}

// StartKafka always starts Kafka in Docker, whatever the environment says,
// and terminates it when tb ends: for tests that stop and start nodes. It
// skips (or with EOS_REQUIRE_SERVICES=1 fails) tb when Docker does not
// answer, and fails it when the containers do not come up.
func StartKafka(tb testing.TB, opts ...KafkaOption) *KafkaContainer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	k, err := RunKafka(ctx, append([]KafkaOption{testLogger(tb)}, opts...)...)
	if err != nil {
		fail(tb, "Kafka", KafkaBrokersEnv, err)
	}
	tb.Cleanup(func() { terminate(tb, "kafka", k.Terminate) })
	return k
}

// StartPostgres always starts PostgreSQL in Docker and terminates it when
// tb ends; it skips or fails like [StartKafka].
func StartPostgres(tb testing.TB, opts ...PostgresOption) *PostgresContainer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	p, err := RunPostgres(ctx, append([]PostgresOption{testLogger(tb)}, opts...)...)
	if err != nil {
		fail(tb, "PostgreSQL", DatabaseURLEnv, err)
	}
	tb.Cleanup(func() { terminate(tb, "postgres", p.Terminate) })
	return p
}

func terminate(tb testing.TB, what string, f func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := f(ctx); err != nil {
		tb.Errorf("eostest: terminate %s container: %v", what, err)
	}
}

// fail ends tb for a service that could not be had: a skip when Docker is
// missing (unless services are required), a failure otherwise.
func fail(tb testing.TB, service, env string, err error) {
	tb.Helper()
	if !errors.Is(err, ErrNoDocker) {
		tb.Fatalf("eostest: %s container: %v", service, err)
	}
	msg := fmt.Sprintf("eostest: no %s: %s is unset and %v. Set %s to a running one, or start Docker.", service, env, err, env)
	if os.Getenv(RequireServicesEnv) == "1" {
		tb.Fatal(msg + " [" + RequireServicesEnv + "=1, so this is a failure, not a skip]")
	}
	tb.Skip(msg)
}

// dockerAnswers returns nil when a Docker engine answers, else an error
// wrapping ErrNoDocker.
func dockerAnswers(ctx context.Context, c common) (err error) {
	reaperOrNot(ctx, c)
	defer func() {
		// testcontainers panics on some hosts with no Docker socket at all.
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrNoDocker, r)
		}
	}()
	p, err := c.provider()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	return nil
}

// ryukDisabledEnv is testcontainers' switch for its reaper, Ryuk.
const ryukDisabledEnv = "TESTCONTAINERS_RYUK_DISABLED"

// reaperOrNot turns testcontainers' reaper off (TESTCONTAINERS_RYUK_DISABLED
// =true in this process's environment) when its image is missing from the
// engine and a pull of it fails within 30 s: the reaper only removes what
// a crashed test binary left, every container of this package is
// terminated by its test, and without its image testcontainers fails every
// container. It looks only in the plain case: the variable empty, no
// ~/.testcontainers.properties, no TESTCONTAINERS_PROVIDER or image-name
// prefix (testcontainers may then use another engine or another name),
// and an engine that answers at DOCKER_HOST or the default socket. It
// logs what it did to c's logger. It must run before testcontainers reads
// its configuration (once per process): it says so when that happened
// already and the switch came too late.
func reaperOrNot(ctx context.Context, c common) {
	if os.Getenv(ryukDisabledEnv) != "" || os.Getenv("TESTCONTAINERS_PROVIDER") != "" ||
		os.Getenv("TESTCONTAINERS_HUB_IMAGE_NAME_PREFIX") != "" {
		return
	}
	if home, err := os.UserHomeDir(); err != nil {
		return
	} else if _, err := os.Stat(filepath.Join(home, ".testcontainers.properties")); err == nil {
		return
	}
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return // testcontainers will say what is wrong with the engine
	}
	defer cli.Close()
	image := testcontainers.ReaperDefaultImage
	if _, err := cli.ImageInspect(ctx, image); !cerrdefs.IsNotFound(err) {
		return // there, or no answer: testcontainers decides
	}
	pullCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pull, err := cli.ImagePull(pullCtx, image, client.ImagePullOptions{})
	if err == nil {
		err = pull.Wait(pullCtx)
	}
	if err == nil || ctx.Err() != nil || client.IsErrConnectionFailed(err) {
		return
	}
	logger := c.logger
	if logger == nil {
		logger = log.Default()
	}
	os.Setenv(ryukDisabledEnv, "true")
	if !testcontainers.ReadConfig().RyukDisabled {
		logger.Printf("eostest: testcontainers' reaper image %s can not be had (%v), and testcontainers read its configuration before eostest could turn the reaper off: set %s=true", image, err, ryukDisabledEnv)
		return
	}
	logger.Printf("eostest: testcontainers' reaper image %s can not be had (%v): reaper off (%s=true); eostest terminates its containers itself", image, err, ryukDisabledEnv)
}

// common is what configures a container of either kind.
type common struct {
	image  string
	host   bool
	labels map[string]string
	// logger takes testcontainers' lines: tb's log under StartKafka and
	// StartPostgres, testcontainers' default (standard error) otherwise.
	logger log.Logger
}

// provider returns a Docker provider that logs to c's logger.
func (c common) provider() (*testcontainers.DockerProvider, error) {
	if c.logger != nil {
		return testcontainers.NewDockerProvider(testcontainers.WithLogger(c.logger))
	}
	return testcontainers.NewDockerProvider()
}

// customizers are the testcontainers options every container gets.
func (c common) customizers() []testcontainers.ContainerCustomizer {
	out := []testcontainers.ContainerCustomizer{testcontainers.WithLabels(c.labels)}
	if c.logger != nil {
		out = append(out, testcontainers.WithLogger(c.logger))
	}
	return out
}

func defaults(imageEnv, image string) common {
	if s := os.Getenv(imageEnv); s != "" {
		image = s
	}
	run := os.Getenv(RunLabelEnv)
	if run == "" {
		run = "1"
	}
	return common{
		image:  image,
		host:   os.Getenv(DockerNetworkEnv) == "host",
		labels: map[string]string{Label: run},
	}
}

// KafkaOption configures [RunKafka] and [StartKafka].
type KafkaOption interface{ applyKafka(*kafkaConfig) }

// PostgresOption configures [RunPostgres] and [StartPostgres].
type PostgresOption interface{ applyPostgres(*postgresConfig) }

// Option configures a container of either kind.
type Option interface {
	KafkaOption
	PostgresOption
}

type commonOpt func(*common)

func (o commonOpt) applyKafka(c *kafkaConfig)       { o(&c.common) }
func (o commonOpt) applyPostgres(c *postgresConfig) { o(&c.common) }

// WithImage runs image instead of the default (the EOSKIT_KAFKA_IMAGE or
// EOSKIT_POSTGRES_IMAGE variable, else [DefaultKafkaImage] or
// [DefaultPostgresImage]). The image must keep the official image's
// contract: apache/kafka's KAFKA_* variables and CLUSTER_ID, or postgres's
// POSTGRES_* variables and PGPORT.
func WithImage(image string) Option { return commonOpt(func(c *common) { c.image = image }) }

// WithHostNetwork runs the containers on the host's network (on) or with
// published ports (off). Default: on when EOSKIT_DOCKER_NETWORK=host.
func WithHostNetwork(on bool) Option { return commonOpt(func(c *common) { c.host = on }) }

// testLogger sends testcontainers' lines to tb's log, shown when tb fails
// or with go test -v.
func testLogger(tb testing.TB) Option {
	return commonOpt(func(c *common) { c.logger = log.TestLogger(tb) })
}

// WithLabel adds a label to the containers.
func WithLabel(key, value string) Option {
	return commonOpt(func(c *common) { c.labels[key] = value })
}
