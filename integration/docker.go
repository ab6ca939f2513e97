package integration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/log"
)

// Default images: the releases eoskit's guarantees are proven on.
const (
	DefaultKafkaImage    = "apache/kafka:4.4.0"
	DefaultPostgresImage = "postgres:15"
)

// Label is set on every container and volume this package starts, with
// the run's token ([TestRunEnv], "1" when unset) as its value, so that a
// CI run can find what its tests left behind.
const Label = "org.eoskit.integration"

// ErrNoDocker is returned (wrapped) by [RunKafka] and [RunPostgres] when no
// Docker engine answers: the one case the lookups treat as "no service"
// rather than as a failure. A DOCKER_HOST that does not answer is no
// Docker too, as for the docker command, although testcontainers would go
// on to the default socket's engine.
var ErrNoDocker = errors.New("integration: no Docker engine answers")

// startTimeout bounds the start of the containers of one call.
const startTimeout = 3 * time.Minute

func terminate(tb testing.TB, what string, f func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := f(ctx); err != nil {
		tb.Errorf("integration: terminate %s container: %v", what, err)
	}
}

// containerFailed ends tb for a container that could not be had:
// [ServiceMissing] when Docker does not answer, a failure otherwise (a
// container that Docker runs but that does not come up is a fault to see).
func containerFailed(tb testing.TB, service, how string, err error) {
	tb.Helper()
	if !errors.Is(err, ErrNoDocker) {
		tb.Fatalf("integration: %s container: %v", service, err)
	}
	ServiceMissing(tb, service, how, err)
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
	if want, got := os.Getenv("DOCKER_HOST"), p.Client().DaemonHost(); want != "" && got != want {
		return fmt.Errorf("%w: DOCKER_HOST=%s does not answer (testcontainers would use %s instead)", ErrNoDocker, want, got)
	}
	return nil
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
	return common{
		image:  image,
		host:   os.Getenv(DockerNetworkEnv) == "host",
		labels: map[string]string{Label: runToken()},
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

// daemonHost returns the host the Docker engine publishes ports on.
func (c common) daemonHost(ctx context.Context) (string, error) {
	p, err := c.provider()
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoDocker, err)
	}
	defer p.Close()
	host, err := p.DaemonHost(ctx)
	if err != nil {
		return "", fmt.Errorf("integration: docker host: %w", err)
	}
	return host, nil
}

// publishOn returns the host address a container's port is published on:
// loopback when the engine runs on this machine (a test's server is no
// one else's to reach), every interface (the zero Addr) when the engine is
// remote and its ports must be reached from here.
func publishOn(daemonHost string) netip.Addr {
	if daemonHost == "localhost" {
		return netip.MustParseAddr("127.0.0.1")
	}
	if ip, err := netip.ParseAddr(daemonHost); err == nil && ip.IsLoopback() {
		return ip // where the clients will connect: ::1 or 127.0.0.2 too
	}
	return netip.Addr{}
}

// publish publishes the container's port (such as "5432/tcp") on
// publishOn(daemonHost), at hostPort ("" for one the engine picks).
func publish(port, daemonHost, hostPort string) testcontainers.CustomizeRequestOption {
	bind := publishOn(daemonHost)
	return func(req *testcontainers.GenericContainerRequest) error {
		if !slices.Contains(req.ExposedPorts, port) {
			req.ExposedPorts = append(req.ExposedPorts, port)
		}
		return testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			if hc.PortBindings == nil {
				hc.PortBindings = network.PortMap{}
			}
			hc.PortBindings[network.MustParsePort(port)] = []network.PortBinding{{HostIP: bind, HostPort: hostPort}}
		})(req)
	}
}
