package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

const localBrokerHowTo = "A private broker needs Java 17+ and Maven (scripts/kafka.sh fetches the jars), " +
	"is started from the eoskit source tree, and runs under `make test` (or with KAFKA_BROKERS set)."

// LocalBroker is a broker of the test's own, started with scripts/kafka.sh in
// a temporary state folder, for tests that stop, kill or restart the broker:
// bouncing the shared broker would break every other test running beside it.
// It is stopped and its data deleted when the test ends.
type LocalBroker struct {
	*KafkaCluster
	script   string
	stateDir string
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
			tb.Logf("integration: clean private broker: %v", err)
		}
	})
	return b
}

// StartLocalBrokerWithACLs starts a private broker that authenticates
// every client (SASL/SCRAM-SHA-512, plaintext, loopback only) and
// authorizes every request (Kafka's StandardAuthorizer,
// allow.everyone.if.no.acl.found false: no ACL, no access), for
// least-privilege tests. Its KafkaCluster (Admin, Client, Seed, Read*)
// acts as the super user; its NewUser makes an application principal,
// which holds only the ACLs the test grants it (Admin.CreateACLs). It skips
// or fails like [StartLocalBroker].
func StartLocalBrokerWithACLs(tb testing.TB) *LocalBroker {
	tb.Helper()
	b := newLocalBroker(tb)
	b.KafkaCluster = startPrivateWith(tb, b.script, b.stateDir, true)
	return b
}

// User is an application principal on a broker or cluster with ACLs.
type User struct {
	Principal string    // User:name, as ACLs name it
	Password  string    // to check that no log or error carries it
	Opts      []kgo.Opt // the seed brokers and the SASL mechanism that connect as it
}

// NewUser creates the SCRAM-SHA-512 user name, with no ACL, on a broker
// or cluster started with ACLs ([StartLocalBrokerWithACLs],
// [StartLocalClusterWithACLs]).
func (k *KafkaCluster) NewUser(tb testing.TB, name string) User {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var secret [16]byte
	_, _ = rand.Read(secret[:])
	pass := hex.EncodeToString(secret[:])
	altered, err := k.Admin.AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: name, Mechanism: kadm.ScramSha512, Iterations: 4096, Password: pass}})
	if err == nil {
		altered.EachError(func(a kadm.AlteredUserSCRAM) { err = fmt.Errorf("%w: %s", a.Err, a.ErrMessage) })
	}
	if err != nil {
		tb.Fatalf("integration: create user %s: %v", name, err)
	}
	// A new credential reaches the broker through its metadata log:
	// wait until it lets the user in.
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...), scramOpt(name, pass)}
	if err := waitForKafka(ctx, opts); err != nil {
		tb.Fatalf("integration: user %s cannot connect: %v", name, err)
	}
	return User{Principal: "User:" + name, Password: pass, Opts: opts}
}

// privateKafkaScript returns the path of the script that runs a private
// broker or cluster, or skips (or, with EOS_REQUIRE_SERVICES=1, fails) tb
// when one cannot run here.
func privateKafkaScript(tb testing.TB, what, rel string) string {
	tb.Helper()
	if os.Getenv(KafkaBrokersEnv) == "" && !servicesRequired() {
		// A private broker takes a minute or more to start and bounce:
		// like every service, it runs when the services are up (make
		// test), not in a quick `go test ./...`.
		missingService(tb, what, localBrokerHowTo,
			fmt.Errorf("no services configured (%s and %s are unset)", KafkaBrokersEnv, RequireServicesEnv))
	}
	script, err := findScript(rel)
	if err != nil {
		missingService(tb, what, localBrokerHowTo, err)
	}
	if _, err := exec.LookPath("java"); err != nil && os.Getenv("JAVA_HOME") == "" {
		missingService(tb, what, localBrokerHowTo, err)
	}
	return script
}

// startPrivate runs script's start on stateDir and connects to the
// bootstrap addresses it prints last (KAFKA_BROKERS=a[,b,c]).
func startPrivate(tb testing.TB, script, stateDir string) *KafkaCluster {
	tb.Helper()
	return startPrivateWith(tb, script, stateDir, false)
}

// startPrivateWith is startPrivate that, with sasl, asks the script for a
// broker or cluster with SASL and ACLs and connects as its super user
// (admin.sasl in its state folder).
func startPrivateWith(tb testing.TB, script, stateDir string, sasl bool) *KafkaCluster {
	tb.Helper()
	var env []string
	if sasl {
		env = []string{"EOSKIT_KAFKA_SASL=1"}
	}
	out, err := runScriptEnv(context.Background(), script, stateDir, env, "start")
	if err != nil && lostPort(stateDir, err.Error()+out) {
		// Another process took a port between the script choosing it
		// and the broker binding it: once more, on fresh ports (the
		// script chooses them once per state folder).
		tb.Logf("integration: %s start lost a port to another process; starting again on fresh ports: %v", filepath.Base(script), err)
		if _, err := runScriptEnv(context.Background(), script, stateDir, env, "stop"); err != nil {
			tb.Fatalf("integration: stop %s after a lost port: %v", filepath.Base(script), err)
		}
		entries, rerr := os.ReadDir(stateDir)
		for _, e := range entries {
			if rerr == nil {
				rerr = os.RemoveAll(filepath.Join(stateDir, e.Name()))
			}
		}
		if rerr != nil {
			tb.Fatalf("integration: empty %s for a fresh start: %v", stateDir, rerr)
		}
		out, err = runScriptEnv(context.Background(), script, stateDir, env, "start")
	}
	if err != nil {
		tb.Fatalf("integration: start %s: %v", filepath.Base(script), err)
	}
	brokers, ok := strings.CutPrefix(strings.TrimSpace(lastLine(out)), KafkaBrokersEnv+"=")
	if !ok {
		tb.Fatalf("integration: %s start printed no %s line: %q", filepath.Base(script), KafkaBrokersEnv, out)
	}
	if !sasl {
		return newKafkaCluster(tb, strings.Split(brokers, ","))
	}
	folder := map[bool]string{true: "cluster", false: "kafka"}[strings.HasSuffix(script, "kafka-cluster.sh")]
	b, err := os.ReadFile(filepath.Join(stateDir, folder, "admin.sasl"))
	user, pass, ok := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if err != nil || !ok {
		tb.Fatalf("integration: %s left no super user's credentials (%v)", filepath.Base(script), err)
	}
	return newKafkaCluster(tb, strings.Split(brokers, ","), scramOpt(user, pass))
}

// lostPort reports whether a broker's start failed on a port another
// process took: said in the script's output, or in a broker log under
// stateDir (the output shows only the logs' last lines).
func lostPort(stateDir, output string) bool {
	const bind = "Address already in use"
	if strings.Contains(output, bind) {
		return true
	}
	found := false
	_ = filepath.WalkDir(stateDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !found && d.Name() == "server.log" {
			b, rerr := os.ReadFile(path)
			found = rerr == nil && strings.Contains(string(b), bind)
		}
		return nil
	})
	return found
}

func scramOpt(user, pass string) kgo.Opt {
	return kgo.SASL(scram.Auth{User: user, Pass: pass}.AsSha512Mechanism())
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
		tb.Logf("integration: stop private broker before keeping it: %v", err)
	}
	if err := os.CopyFS(dest, os.DirFS(b.stateDir)); err != nil {
		tb.Logf("integration: keep private broker: %v", err)
		return
	}
	tb.Logf("integration: kept the failed test's broker data and logs in %s", dest)
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

// Log returns the path of the broker's server log, for a failing test to show.
func (b *LocalBroker) Log() string { return filepath.Join(b.stateDir, "kafka", "logs", "server.log") }

func (b *LocalBroker) do(ctx context.Context, args ...string) error {
	_, err := b.run(ctx, args...)
	return err
}

func (b *LocalBroker) run(ctx context.Context, args ...string) (string, error) {
	return runScript(ctx, b.script, b.stateDir, args...)
}

// runScript runs one of the service scripts on the state folder stateDir.
func runScript(ctx context.Context, script, stateDir string, args ...string) (string, error) {
	return runScriptEnv(ctx, script, stateDir, nil, args...)
}

// runScriptEnv is runScript with env added to the script's environment.
func runScriptEnv(ctx context.Context, script, stateDir string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
	// A SASL broker only when asked for here: an EOSKIT_KAFKA_SASL
	// exported in the shell must not turn every private broker into one.
	inherited := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "EOSKIT_KAFKA_SASL=") })
	cmd.Env = append(append(inherited, env...), "EOSKIT_STATE_DIR="+stateDir,
		// The broker must not outlive this test binary, however it ends.
		"EOSKIT_OWNER_PID="+strconv.Itoa(os.Getpid()), startedByTest())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(script), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// findScript walks up from the working directory (a test runs in its
// package's folder) to the eoskit module root and returns rel under it.
func findScript(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(mod, []byte("module github.com/eoskit/eoskit\n")) {
			p := filepath.Join(dir, rel)
			if _, err := os.Stat(p); err != nil {
				return "", err
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the eoskit source tree")
		}
		dir = parent
	}
}

// LocalCluster is a three-node KRaft cluster of the test's own
// (scripts/kafka-cluster.sh): replication factor 3 and min.insync.replicas
// 2 for every topic, internal ones included, for tests that bounce brokers.
// A bounce then moves partition leadership instead of leaving partitions
// leaderless, as a single broker must (where Kafka 4.1-4.4 drops
// transaction markers, KAFKA-20734). Nodes are numbered 1 to 3. It is
// stopped and its data deleted when the test ends.
type LocalCluster struct {
	*KafkaCluster
	script   string
	stateDir string
}

// StartLocalClusterWithACLs starts a private three-node cluster that, like
// [StartLocalBrokerWithACLs], authenticates every client (SASL/SCRAM, on
// the brokers' listeners and the proxies' alike) and authorizes every
// request; its KafkaCluster acts as the super user.
func StartLocalClusterWithACLs(tb testing.TB) *LocalCluster {
	tb.Helper()
	c := newLocalCluster(tb)
	c.KafkaCluster = startPrivateWith(tb, c.script, c.stateDir, true)
	return c
}

// StartLocalCluster starts a private three-node cluster and returns it once
// every node is a live broker. It skips or fails like [StartLocalBroker].
// Starting one takes 10 to 20 seconds and three broker JVMs.
func StartLocalCluster(tb testing.TB) *LocalCluster {
	tb.Helper()
	c := newLocalCluster(tb)
	c.KafkaCluster = startPrivate(tb, c.script, c.stateDir)
	return c
}

// newLocalCluster prepares a private cluster's state folder and its
// cleanup.
func newLocalCluster(tb testing.TB) *LocalCluster {
	tb.Helper()
	c := &LocalCluster{script: privateKafkaScript(tb, "private Kafka cluster", "scripts/kafka-cluster.sh"), stateDir: tb.TempDir()}
	tb.Cleanup(func() {
		if _, err := runScript(context.Background(), c.script, c.stateDir, "clean"); err != nil {
			tb.Logf("integration: clean private cluster: %v", err)
		}
	})
	return c
}

func (c *LocalCluster) do(ctx context.Context, args ...string) error {
	_, err := runScript(ctx, c.script, c.stateDir, args...)
	return err
}

// Kill kills node (1 to 3) with SIGKILL and waits until it is gone.
func (c *LocalCluster) Kill(ctx context.Context, node int) error {
	return c.do(ctx, "kill", strconv.Itoa(node))
}

// StartNode starts node again on its data and returns once every replica
// is in sync.
func (c *LocalCluster) StartNode(ctx context.Context, node int) error {
	return c.do(ctx, "start-node", strconv.Itoa(node))
}

// Pause stops node with SIGSTOP (a hung broker); Resume sends SIGCONT.
func (c *LocalCluster) Pause(ctx context.Context, node int) error {
	return c.do(ctx, "pause", strconv.Itoa(node))
}

// Resume continues a paused node.
func (c *LocalCluster) Resume(ctx context.Context, node int) error {
	return c.do(ctx, "resume", strconv.Itoa(node))
}

// Restart stops node (SIGKILL when hard), starts it, and returns once every
// replica is in sync.
func (c *LocalCluster) Restart(ctx context.Context, node int, hard bool) error {
	if hard {
		return c.do(ctx, "restart", strconv.Itoa(node), "--hard")
	}
	return c.do(ctx, "restart", strconv.Itoa(node))
}

// RollingRestart restarts the nodes one by one, each once the cluster is
// whole again.
func (c *LocalCluster) RollingRestart(ctx context.Context, hard bool) error {
	if hard {
		return c.do(ctx, "rolling-restart", "--hard")
	}
	return c.do(ctx, "rolling-restart")
}
