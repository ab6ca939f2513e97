package testbed

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eoskit/eoskit/integration"
)

const localBrokerHowTo = "A private broker needs Java 17+ and Maven (scripts/kafka.sh fetches the jars), " +
	"is started from the eoskit source tree, and runs under `make test` (or with KAFKA_BROKERS set)."

// LocalBroker is a broker of the test's own, started with scripts/kafka.sh in
// a temporary state folder, for tests that stop, kill or restart the broker:
// bouncing the shared broker would break every other test running beside it.
// It is stopped and its data deleted when the test ends.
type LocalBroker struct {
	*integration.KafkaCluster
	script   string
	stateDir string
	env      []string // the script's security mode, for every later command (a restart)
}

// StartLocalBroker starts a private broker and returns it ready. With no
// services configured (neither KAFKA_BROKERS nor EOS_REQUIRE_SERVICES set),
// or without Java or the eoskit source tree, it skips (or, with
// EOS_REQUIRE_SERVICES=1, fails) tb. Starting one takes a few seconds; the first ever run also downloads the
// broker jars.
func StartLocalBroker(tb testing.TB) *LocalBroker {
	tb.Helper()
	b := newLocalBroker(tb)
	b.KafkaCluster = startPrivate(tb, b.script, b.stateDir)
	return b
}

// newLocalBroker prepares a private broker's state folder and its cleanup.
func newLocalBroker(tb testing.TB) *LocalBroker {
	tb.Helper()
	b := &LocalBroker{script: privateKafkaScript(tb, "private Kafka broker", "scripts/kafka.sh"), stateDir: tb.TempDir()}
	tb.Cleanup(func() {
		if keep := os.Getenv(KeepFailedBrokerEnv); keep != "" && tb.Failed() {
			b.keep(tb, keep)
		}
		if _, err := b.run(context.Background(), "clean"); err != nil {
			tb.Logf("testbed: clean private broker: %v", err)
		}
	})
	return b
}

// StartLocalBrokerWithACLs starts a private broker that authenticates
// every client (SASL/SCRAM-SHA-512, plaintext, loopback only) and
// authorizes every request (Kafka's StandardAuthorizer,
// allow.everyone.if.no.acl.found false: no ACL, no access), for
// least-privilege tests. Its KafkaCluster (Admin, Client, Seed, Read*)
// acts as the super user; [NewUser] makes an application principal,
// which holds only the ACLs the test grants it (Admin.CreateACLs). It skips
// or fails like [StartLocalBroker].
func StartLocalBrokerWithACLs(tb testing.TB) *LocalBroker {
	tb.Helper()
	b := newLocalBroker(tb)
	b.KafkaCluster = startPrivateWith(tb, b.script, b.stateDir, saslACLs)
	b.env = securityEnv(saslACLs)
	return b
}

// StartLocalBrokerWithTLS is [StartLocalBrokerWithACLs] on a SASL_SSL
// listener: the broker's certificate, for 127.0.0.1 and localhost, is
// signed by a CA made for it, whose certificate is [LocalBroker.CAFile];
// its KafkaCluster connects as the super user over TLS, trusting that CA
// alone and checking the host name.
func StartLocalBrokerWithTLS(tb testing.TB) *LocalBroker {
	tb.Helper()
	b := newLocalBroker(tb)
	b.KafkaCluster = startPrivateWith(tb, b.script, b.stateDir, saslTLS)
	b.env = securityEnv(saslTLS)
	return b
}

// CAFile is the CA certificate (PEM) a broker of [StartLocalBrokerWithTLS]
// is signed by.
func (b *LocalBroker) CAFile() string { return filepath.Join(b.stateDir, "kafka", "tls", "ca.pem") }

// MutualTLS returns how a client reaches a broker of
// [StartLocalBrokerWithTLS] with mutual TLS: the addresses of its MTLS
// listener, a client TLS configuration presenting the certificate the
// broker's CA signed for it (and trusting that CA alone, the host name
// checked), and the principal the broker takes it for, which holds only
// the ACLs the test grants it.
func (b *LocalBroker) MutualTLS(tb testing.TB) (brokers []string, cfg *tls.Config, principal string) {
	tb.Helper()
	dir := filepath.Join(b.stateDir, "kafka")
	addrs, err := os.ReadFile(filepath.Join(dir, "bootstrap-mtls"))
	if err != nil {
		tb.Fatalf("testbed: the broker has no mutual-TLS listener (StartLocalBrokerWithTLS makes one): %v", err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls", "client.pem"), filepath.Join(dir, "tls", "client.key"))
	if err != nil {
		tb.Fatalf("testbed: the client's certificate: %v", err)
	}
	cfg = TLSConfig(tb, b.CAFile())
	cfg.Certificates = []tls.Certificate{cert}
	return strings.Split(strings.TrimSpace(string(addrs)), ","), cfg, "User:CN=eoskit-client"
}

// KeepFailedBrokerEnv names a folder: when a test with a private broker
// fails, the broker's data and logs are copied there (under the test's
// name), so that its log segments and server.log can be examined.
const KeepFailedBrokerEnv = "EOS_KEEP_FAILED_BROKER"

func (b *LocalBroker) keep(tb testing.TB, dir string) {
	dest := filepath.Join(dir, strings.NewReplacer("/", "_").Replace(tb.Name())+"-"+time.Now().Format("150405"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Stop(ctx); err != nil {
		tb.Logf("testbed: stop private broker before keeping it: %v", err)
	}
	if err := os.CopyFS(dest, os.DirFS(b.stateDir)); err != nil {
		tb.Logf("testbed: keep private broker: %v", err)
		return
	}
	tb.Logf("testbed: kept the failed test's broker data and logs in %s", dest)
}

// Stop shuts the broker down cleanly (SIGTERM) and waits until it is gone.
func (b *LocalBroker) Stop(ctx context.Context) error { return b.do(ctx, "stop") }

// Kill kills the broker with SIGKILL, as a crash or power loss would, and
// waits until it is gone.
func (b *LocalBroker) Kill(ctx context.Context) error { return b.do(ctx, "kill") }

// Start starts a stopped or killed broker again on the same data and port,
// and returns once it answers Metadata.
func (b *LocalBroker) Start(ctx context.Context) error { return b.do(ctx, "start") }

// Restart stops the broker (with SIGKILL when hard) and starts it again.
func (b *LocalBroker) Restart(ctx context.Context, hard bool) error {
	if hard {
		return b.do(ctx, "restart", "--hard")
	}
	return b.do(ctx, "restart")
}

// LongOutage is how long the runners' fault tests keep a broker away: a
// coordinator gone for longer than a transaction's end is retried (30 s),
// as a managed cluster's maintenance or a lost zone keeps it.
const LongOutage = 35 * time.Second

// Outage kills the broker with SIGKILL, keeps it down for d, and starts it
// again on the same data: every coordinator, leader and group gone that
// long.
func (b *LocalBroker) Outage(ctx context.Context, d time.Duration) error {
	if err := b.Kill(ctx); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	return b.Start(ctx)
}

// Log returns the path of the broker's server log, for a failing test to show.
func (b *LocalBroker) Log() string { return filepath.Join(b.stateDir, "kafka", "logs", "server.log") }

func (b *LocalBroker) do(ctx context.Context, args ...string) error {
	_, err := b.run(ctx, args...)
	return err
}

func (b *LocalBroker) run(ctx context.Context, args ...string) (string, error) {
	return runScriptEnv(ctx, b.script, b.stateDir, b.env, args...)
}
