package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/eoskit/eoskit/testsupport/freeport"
)

// The role and database of a PostgreSQL container. Its password is
// random, made per container: the server is a superuser's, reachable by
// every local user (and, with a remote engine, every host).
const (
	postgresUser = "eoskit"
	postgresDB   = "eoskit"
)

type postgresConfig struct {
	common
}

// PostgresContainer is PostgreSQL running in Docker.
type PostgresContainer struct {
	ctr *tcpostgres.PostgresContainer
	url string
}

// URL returns the URL of the container's database, as its superuser
// (which may create databases).
func (p *PostgresContainer) URL() string { return p.url }

// Terminate removes the container and its data.
func (p *PostgresContainer) Terminate(ctx context.Context) error {
	return p.ctr.Terminate(ctx)
}

// StartPostgres always starts PostgreSQL in Docker and terminates it when
// tb ends; it skips or fails like [StartKafka].
func StartPostgres(tb testing.TB, opts ...PostgresOption) *PostgresContainer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	p, err := RunPostgres(ctx, append([]PostgresOption{testLogger(tb)}, opts...)...)
	if err != nil {
		containerFailed(tb, "PostgreSQL", postgresHowTo, err)
	}
	tb.Cleanup(func() { terminate(tb, "postgres", p.Terminate) })
	return p
}

// RunPostgres starts PostgreSQL in Docker, through testcontainers-go's
// postgres module, and returns once it takes connections. The caller
// terminates it. Errors are as for [RunKafka]: on any, what had started is
// terminated already.
func RunPostgres(ctx context.Context, opts ...PostgresOption) (*PostgresContainer, error) {
	cfg := postgresConfig{common: defaults(PostgresImageEnv, DefaultPostgresImage)}
	for _, o := range opts {
		o.applyPostgres(&cfg)
	}
	if err := dockerAnswers(ctx, cfg.common); err != nil {
		return nil, err
	}
	var secret [16]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, err
	}
	postgresPassword := hex.EncodeToString(secret[:])
	custom := append(cfg.customizers(),
		// docker stop's signal: a fast shutdown, as the official image's
		// STOPSIGNAL, for any image (SIGTERM waits for every client).
		testcontainers.WithConfigModifier(func(c *container.Config) { c.StopSignal = "SIGINT" }),
		tcpostgres.WithUsername(postgresUser),
		tcpostgres.WithPassword(postgresPassword),
		tcpostgres.WithDatabase(postgresDB),
		// The outbox reads the log by logical decoding (the embedded
		// server sets it too).
		testcontainers.WithCmdArgs("-c", "wal_level=logical"),
	)
	var port int
	if cfg.host {
		// On the host's network the server takes a free port of its own
		// (PGPORT), on loopback only.
		free, err := freeport.Ports(1)
		if err != nil {
			return nil, err
		}
		port = free[0]
		custom = append(custom,
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
			testcontainers.WithEndpointSettingsModifier(func(m map[string]*network.EndpointSettings) { clear(m) }),
			testcontainers.WithEnv(map[string]string{"PGPORT": strconv.Itoa(port)}),
			testcontainers.WithCmdArgs("-c", "listen_addresses=127.0.0.1"),
			// The first start logs "ready" twice: the init server, then the
			// real one.
			testcontainers.WithWaitStrategyAndDeadline(2*time.Minute,
				wait.ForLog("database system is ready to accept connections").WithOccurrence(2)),
		)
	} else {
		// Published on loopback only where the engine is this machine's.
		host, err := cfg.daemonHost(ctx)
		if err != nil {
			return nil, err
		}
		custom = append(custom, publish("5432/tcp", host, ""), tcpostgres.BasicWaitStrategies())
	}
	ctr, err := tcpostgres.Run(ctx, cfg.image, custom...)
	p := &PostgresContainer{ctr: ctr}
	fail := func(err error) (*PostgresContainer, error) {
		if ctr == nil {
			return nil, err
		}
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return nil, errors.Join(err, p.Terminate(stopCtx))
	}
	if err != nil {
		return fail(fmt.Errorf("integration: start %s: %w", cfg.image, err))
	}
	if cfg.host {
		u := url.URL{
			Scheme:   "postgres",
			User:     url.UserPassword(postgresUser, postgresPassword),
			Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			Path:     "/" + postgresDB,
			RawQuery: "sslmode=disable",
		}
		p.url = u.String()
	} else if p.url, err = ctr.ConnectionString(ctx, "sslmode=disable"); err != nil {
		return fail(fmt.Errorf("integration: %s: %w", cfg.image, err))
	}
	if err := ping(ctx, p.url); err != nil {
		logs, _ := lastLines(context.Background(), ctr, 30)
		return fail(fmt.Errorf("integration: %s started but takes no connection: %w; its last lines:\n%s", cfg.image, err, logs))
	}
	return p, nil
}

// ping returns once a connection to url runs a query, or with the last
// error when ctx ends.
func ping(ctx context.Context, url string) error {
	for {
		err := func() error {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			return conn.Ping(ctx)
		}()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}
