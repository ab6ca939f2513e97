package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// Images used when the services come from Docker.
const (
	KafkaImage    = "apache/kafka:4.1.0"
	PostgresImage = "postgres:16-alpine"
)

// containers starts each service at most once per test binary: a broker per
// test would cost seconds each. This is the package's only shared state, and
// testcontainers' reaper removes the containers when the binary exits.
var containers struct {
	kafkaOnce, pgOnce sync.Once
	kafkaBrokers      string
	kafkaErr          error
	pgURL             string
	pgErr             error
}

func dockerHealthy(ctx context.Context) (err error) {
	defer func() {
		// testcontainers panics on some hosts with no Docker socket at all.
		if r := recover(); r != nil {
			err = fmt.Errorf("docker provider: %v", r)
		}
	}()
	p, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return err
	}
	defer p.Close()
	return p.Health(ctx)
}

func kafkaFromDocker() (string, error) {
	containers.kafkaOnce.Do(func() {
		containers.kafkaBrokers, containers.kafkaErr = startKafkaContainer(context.Background())
	})
	return containers.kafkaBrokers, containers.kafkaErr
}

func postgresFromDocker() (string, error) {
	containers.pgOnce.Do(func() {
		containers.pgURL, containers.pgErr = startPostgresContainer(context.Background())
	})
	return containers.pgURL, containers.pgErr
}

// startKafkaContainer runs the official apache/kafka image. Its advertised
// listener must name the host port Docker mapped, which is only known after
// the container started; so the container waits for a file carrying that
// address, written by a post-start hook, before it execs the broker.
func startKafkaContainer(ctx context.Context) (string, error) {
	if err := dockerHealthy(ctx); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	const advertisedFile = "/tmp/eoskit-advertised-listener"
	var brokers string
	ctr, err := testcontainers.Run(ctx, KafkaImage,
		testcontainers.WithExposedPorts("9092/tcp"),
		testcontainers.WithEnv(map[string]string{
			"KAFKA_NODE_ID":                                          "1",
			"KAFKA_PROCESS_ROLES":                                    "broker,controller",
			"KAFKA_LISTENERS":                                        "PLAINTEXT://0.0.0.0:9092,CONTROLLER://localhost:9093",
			"KAFKA_CONTROLLER_LISTENER_NAMES":                        "CONTROLLER",
			"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":                   "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
			"KAFKA_CONTROLLER_QUORUM_VOTERS":                         "1@localhost:9093",
			"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":                 "1",
			"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":                     "1",
			"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR":         "1",
			"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":                    "1",
			"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
			"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR":            "1",
			"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":                 "0",
			"KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS":                     "1000",
			"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                        "false",
		}),
		testcontainers.WithEntrypoint("sh", "-c",
			"while [ ! -f "+advertisedFile+" ]; do sleep 0.1; done; "+
				"export KAFKA_ADVERTISED_LISTENERS=$(cat "+advertisedFile+"); exec /etc/kafka/docker/run"),
		testcontainers.WithAdditionalLifecycleHooks(testcontainers.ContainerLifecycleHooks{
			PostStarts: []testcontainers.ContainerHook{func(ctx context.Context, c testcontainers.Container) error {
				host, err := c.Host(ctx)
				if err != nil {
					return err
				}
				port, err := c.MappedPort(ctx, "9092/tcp")
				if err != nil {
					return err
				}
				brokers = fmt.Sprintf("%s:%d", host, port.Num())
				return c.CopyToContainer(ctx, []byte("PLAINTEXT://"+brokers), advertisedFile, 0o644)
			}},
		}),
	)
	if err != nil {
		if ctr != nil {
			_ = ctr.Terminate(context.Background())
		}
		return "", fmt.Errorf("start %s: %w", KafkaImage, err)
	}
	if err := waitForKafka(ctx, connOpts(strings.Split(brokers, ","))); err != nil {
		_ = ctr.Terminate(context.Background())
		return "", fmt.Errorf("kafka at %s does not answer: %w", brokers, err)
	}
	return brokers, nil
}

func startPostgresContainer(ctx context.Context) (string, error) {
	if err := dockerHealthy(ctx); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	ctr, err := tcpostgres.Run(ctx, PostgresImage,
		tcpostgres.WithDatabase("eoskit"),
		tcpostgres.WithUsername("eoskit"),
		tcpostgres.WithPassword("eoskit"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		if ctr != nil {
			_ = ctr.Terminate(context.Background())
		}
		return "", fmt.Errorf("start %s: %w", PostgresImage, err)
	}
	return ctr.ConnectionString(ctx, "sslmode=disable")
}
